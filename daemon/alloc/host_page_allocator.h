#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/alloc/page_run_set.h"

namespace hicache {

// Allocator of one rank's physical host (L2) pages, [0, num_pages).
//
// Reserve(n) is contiguous-preferred: one run when one is long enough,
// otherwise the fewest runs (largest first). Free pages are kept as runs, so
// both calls cost O(fragments * log runs) however large and fragmented the
// pool is.
//
// Every failure leaves the allocator exactly as it was.
// Thread-compatible: the engine serializes calls.
class HostPageAllocator {
 public:
  // INVALID_ARGUMENT unless 0 <= num_pages <= 2^40.
  static absl::StatusOr<HostPageAllocator> Create(int64_t num_pages);

  // n pages in ascending order. INVALID_ARGUMENT if n < 0 or n > num_pages();
  // RESOURCE_EXHAUSTED (with AccountingString()) if fewer than n are free.
  absl::StatusOr<std::vector<int64_t>> Reserve(int64_t n);

  // Reserves exactly `pages` (recovery: the pages a durable index records).
  // INVALID_ARGUMENT, changing nothing, if any page is out of range,
  // repeated, or already reserved.
  absl::Status ReserveExactly(absl::Span<const int64_t> pages);
  // Returns reserved pages. INVALID_ARGUMENT, changing nothing, if any page is
  // out of range, repeated, or not currently reserved (double free).
  absl::Status Free(absl::Span<const int64_t> pages);

  int64_t num_pages() const { return free_.capacity(); }
  int64_t free_pages() const { return free_.size(); }
  int64_t used_pages() const { return num_pages() - free_pages(); }
  int64_t num_free_runs() const { return free_.num_runs(); }
  int64_t largest_free_run() const { return free_.largest_run(); }
  bool IsFree(int64_t page) const { return free_.Contains(page); }

  // "host pages=N free=F (R runs, largest L) used=U".
  std::string AccountingString() const;

  absl::Status CheckInvariants() const { return free_.CheckInvariants(); }

 private:
  explicit HostPageAllocator(int64_t num_pages);

  PageRunSet free_;
};

}  // namespace hicache
