#include "daemon/alloc/page_run_set.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace hicache {

absl::StatusOr<std::vector<PageRun>> ToSortedRuns(
    absl::Span<const int64_t> pages, int64_t min_page, int64_t capacity,
    absl::string_view what) {
  std::vector<int64_t> sorted(pages.begin(), pages.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<PageRun> runs;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const int64_t page = sorted[i];
    if (page < min_page || page >= capacity) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": page ", page, " is outside [", min_page, ", ",
                       capacity, ")"));
    }
    if (i > 0 && sorted[i - 1] == page) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": page ", page, " appears more than once"));
    }
    if (!runs.empty() && runs.back().end() == page) {
      ++runs.back().length;
    } else {
      runs.push_back(PageRun{page, 1});
    }
  }
  return runs;
}

bool PageRunSet::Contains(int64_t page) const {
  return Overlaps(PageRun{page, 1});
}

bool PageRunSet::Overlaps(PageRun run) const {
  // The last run starting before run.end() is the only candidate.
  auto it = by_start_.lower_bound(run.end());
  if (it == by_start_.begin()) return false;
  --it;
  return it->first + it->second > run.start;
}

bool PageRunSet::ContainsAll(PageRun run) const {
  auto it = by_start_.upper_bound(run.start);
  if (it == by_start_.begin()) return false;
  --it;
  return it->first <= run.start && it->first + it->second >= run.end();
}

void PageRunSet::Remove(PageRun run) {
  auto it = by_start_.upper_bound(run.start);
  --it;  // REQUIRES: ContainsAll(run).
  const int64_t start = it->first;
  const int64_t end = it->first + it->second;
  Erase(start, it->second);
  if (start < run.start) Insert(start, run.start - start);
  if (run.end() < end) Insert(run.end(), end - run.end());
}

void PageRunSet::Insert(int64_t start, int64_t length) {
  by_start_.emplace(start, length);
  by_length_.emplace(length, start);
  size_ += length;
}

void PageRunSet::Erase(int64_t start, int64_t length) {
  by_start_.erase(start);
  by_length_.erase({length, start});
  size_ -= length;
}

void PageRunSet::Add(PageRun run) {
  int64_t start = run.start;
  int64_t end = run.end();
  auto next = by_start_.lower_bound(start);
  if (next != by_start_.end() && next->first == end) {
    end += next->second;
    Erase(next->first, next->second);
  }
  auto prev = by_start_.lower_bound(start);
  if (prev != by_start_.begin()) {
    --prev;
    if (prev->first + prev->second == start) {
      start = prev->first;
      Erase(prev->first, prev->second);
    }
  }
  Insert(start, end - start);
}

std::optional<int64_t> PageRunSet::TakeBestFitRun(int64_t n) {
  auto it = by_length_.lower_bound({n, std::numeric_limits<int64_t>::min()});
  if (it == by_length_.end()) return std::nullopt;
  const auto [length, start] = *it;
  Erase(start, length);
  if (length > n) Insert(start + n, length - n);
  return start;
}

void PageRunSet::TakeContiguousPreferred(int64_t n,
                                         std::vector<int64_t>* out) {
  const size_t first = out->size();
  int64_t remaining = n;
  while (remaining > 0) {
    std::optional<int64_t> start = TakeBestFitRun(remaining);
    int64_t taken = remaining;
    if (!start.has_value()) {
      // No run is long enough: take the largest whole.
      const auto [length, largest_start] = *by_length_.rbegin();
      Erase(largest_start, length);
      start = largest_start;
      taken = length;
    }
    for (int64_t i = 0; i < taken; ++i) out->push_back(*start + i);
    remaining -= taken;
  }
  std::sort(out->begin() + first, out->end());
}

absl::Status PageRunSet::CheckInvariants() const {
  if (by_start_.size() != by_length_.size()) {
    return absl::InternalError("run indexes differ in size");
  }
  int64_t total = 0;
  int64_t previous_end = -1;
  for (const auto& [start, length] : by_start_) {
    if (length <= 0 || start < 0 || start + length > capacity_) {
      return absl::InternalError(
          absl::StrCat("run [", start, ", +", length, ") out of range"));
    }
    if (start <= previous_end) {
      return absl::InternalError(
          absl::StrCat("run at ", start, " overlaps or touches the previous "
                       "run (not maximal)"));
    }
    if (!by_length_.contains({length, start})) {
      return absl::InternalError(
          absl::StrCat("run at ", start, " missing from the length index"));
    }
    previous_end = start + length;
    total += length;
  }
  if (total != size_) {
    return absl::InternalError(
        absl::StrCat("size ", size_, " but runs hold ", total));
  }
  return absl::OkStatus();
}

}  // namespace hicache
