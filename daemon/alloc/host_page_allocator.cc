#include "daemon/alloc/host_page_allocator.h"

#include "absl/strings/str_cat.h"

namespace hicache {

namespace {
constexpr int64_t kMaxPages = int64_t{1} << 40;
}  // namespace

absl::StatusOr<HostPageAllocator> HostPageAllocator::Create(
    int64_t num_pages) {
  if (num_pages < 0 || num_pages > kMaxPages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host pool must have 0 to ", kMaxPages, " pages, got ", num_pages));
  }
  return HostPageAllocator(num_pages);
}

HostPageAllocator::HostPageAllocator(int64_t num_pages) : free_(num_pages) {
  if (num_pages > 0) free_.Add(PageRun{0, num_pages});
}

absl::StatusOr<std::vector<int64_t>> HostPageAllocator::Reserve(int64_t n) {
  if (n < 0 || n > num_pages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host reservation of ", n, " pages is outside [0, ", num_pages(), "]"));
  }
  if (n > free_.size()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "host reservation of ", n, " pages: ", AccountingString()));
  }
  std::vector<int64_t> pages;
  pages.reserve(n);
  free_.TakeContiguousPreferred(n, &pages);
  return pages;
}

absl::Status HostPageAllocator::ReserveExactly(
    absl::Span<const int64_t> pages) {
  absl::StatusOr<std::vector<PageRun>> runs =
      ToSortedRuns(pages, 0, num_pages(), "host reserve");
  if (!runs.ok()) return runs.status();
  for (const PageRun& run : *runs) {
    if (!free_.ContainsAll(run)) {
      for (int64_t page = run.start; page < run.end(); ++page) {
        if (!free_.Contains(page)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "host reserve: page ", page, " is already reserved"));
        }
      }
    }
  }
  for (const PageRun& run : *runs) free_.Remove(run);
  return absl::OkStatus();
}

absl::Status HostPageAllocator::Free(absl::Span<const int64_t> pages) {
  absl::StatusOr<std::vector<PageRun>> runs =
      ToSortedRuns(pages, 0, num_pages(), "host free");
  if (!runs.ok()) return runs.status();
  for (const PageRun& run : *runs) {
    if (free_.Overlaps(run)) {
      for (int64_t page = run.start; page < run.end(); ++page) {
        if (free_.Contains(page)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "host free: page ", page, " is not reserved (double free?)"));
        }
      }
    }
  }
  for (const PageRun& run : *runs) free_.Add(run);
  return absl::OkStatus();
}

std::string HostPageAllocator::AccountingString() const {
  return absl::StrCat("host pages=", num_pages(), " free=", free_pages(),
                      " (", num_free_runs(), " runs, largest ",
                      largest_free_run(), ") used=", used_pages());
}

}  // namespace hicache
