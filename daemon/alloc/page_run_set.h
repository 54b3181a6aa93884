#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hicache {

// A run of consecutive page indices [start, start + length).
struct PageRun {
  int64_t start = 0;
  int64_t length = 0;
  int64_t end() const { return start + length; }
  bool operator==(const PageRun&) const = default;
};

// Sorts `pages`, checks every page is in [min_page, capacity) and appears
// once, and groups them into maximal runs. INVALID_ARGUMENT (naming `what` and
// the offending page) otherwise. Never mutates anything.
absl::StatusOr<std::vector<PageRun>> ToSortedRuns(
    absl::Span<const int64_t> pages, int64_t min_page, int64_t capacity,
    absl::string_view what);

// A set of page indices in [0, capacity), stored as maximal disjoint runs and
// indexed both by address and by run length. Memory is O(runs), not O(pages),
// and every operation is O(log runs) per run touched, so it stays fast on huge
// fragmented pools.
//
// Thread-compatible: callers synchronize.
class PageRunSet {
 public:
  explicit PageRunSet(int64_t capacity) : capacity_(capacity) {}

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return size_; }  // Pages in the set.
  bool empty() const { return size_ == 0; }
  int64_t num_runs() const { return static_cast<int64_t>(by_start_.size()); }
  int64_t largest_run() const {
    return by_length_.empty() ? 0 : by_length_.rbegin()->first;
  }

  bool Contains(int64_t page) const;
  // Whether any page of `run` is in the set.
  bool Overlaps(PageRun run) const;

  // Adds `run`, merging with adjacent runs. REQUIRES: run inside
  // [0, capacity), length > 0, and !Overlaps(run).
  void Add(PageRun run);

  // Whether every page of `run` is in the set (inside one maximal run).
  bool ContainsAll(PageRun run) const;
  // Removes exactly the pages of `run`. REQUIRES: ContainsAll(run),
  // run.length > 0.
  void Remove(PageRun run);

  // Removes and returns the first `n` pages of the smallest run that has at
  // least `n` (lowest address among equals); nullopt if no run is that long.
  // REQUIRES: n > 0.
  std::optional<int64_t> TakeBestFitRun(int64_t n);

  // Removes `n` pages, one run when one is long enough, otherwise the fewest
  // runs possible (largest first; the last piece best-fit). Appends them to
  // `out` in ascending order. REQUIRES: 0 <= n <= size().
  void TakeContiguousPreferred(int64_t n, std::vector<int64_t>* out);

  // Visits runs in ascending address order.
  template <typename Fn>
  void ForEachRun(Fn fn) const {
    for (const auto& [start, length] : by_start_) fn(PageRun{start, length});
  }

  // Internal consistency: runs disjoint, maximal, in range, both indexes
  // agree, size matches. O(runs). For tests and debug checks.
  absl::Status CheckInvariants() const;

 private:
  void Insert(int64_t start, int64_t length);
  void Erase(int64_t start, int64_t length);

  int64_t capacity_;
  int64_t size_ = 0;
  absl::btree_map<int64_t, int64_t> by_start_;               // start -> length
  absl::btree_set<std::pair<int64_t, int64_t>> by_length_;  // (length, start)
};

}  // namespace hicache
