#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/alloc/page_run_set.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

// Per-lane page counts of a DevicePageAllocator.
struct LaneCounts {
  int64_t free = 0;       // In the free runs, ready to hand out.
  int64_t release = 0;    // Freed, waiting to be merged into the free runs.
  int64_t allocated = 0;  // Handed out and not yet freed.
  int64_t available() const { return free + release; }
};

// Allocator of device (L1) pages in the logical page space over all C lanes.
//
// Lane l's pages are physical pages [1, pages_per_lane) of rank l (physical
// page 0 is the reserved padding page, see CpLayout); logical page
// L = physical * C + lane.
//
// Free() is O(k log k): pages go to a per-lane release list after validation.
// The release list is merged into the free runs (sorted) lazily, only when an
// allocation needs it, so frees stay cheap on the hot path.
//
// Every call checks its input and the capacity it needs before it mutates
// anything: a failed call leaves the allocator exactly as it was.
// Thread-compatible: the engine serializes calls.
class DevicePageAllocator {
 public:
  // INVALID_ARGUMENT unless total_logical_pages is a multiple of C and each
  // lane has at least 2 pages (one is reserved) and at most 2^40.
  static absl::StatusOr<DevicePageAllocator> Create(
      const CpLayout& layout, int64_t total_logical_pages);

  // `owners.size()` logical pages, page i in lane owners[i], all or nothing.
  // Within a lane, pages are physically contiguous when a long enough free run
  // exists, else drawn from the fewest runs, and ascend in position order.
  // INVALID_ARGUMENT for an owner >= C or a lane demand above the lane's size;
  // RESOURCE_EXHAUSTED (with AccountingString()) when a lane is short.
  absl::StatusOr<std::vector<LogicalPage>> AllocateWithOwners(
      absl::Span<const Rank> owners);

  // n logical pages from any lanes, spread to keep lanes balanced (each next
  // page goes to the lane with the most available pages). Ascending.
  // INVALID_ARGUMENT if n < 0 or n exceeds the pool; RESOURCE_EXHAUSTED if
  // fewer than n pages are available in total.
  absl::StatusOr<std::vector<LogicalPage>> Allocate(int64_t n);

  // Returns allocated pages. INVALID_ARGUMENT, changing nothing, for a
  // negative or out-of-pool page, a reserved padding page, a repeated page,
  // or a page that is not allocated (double free, never allocated).
  absl::Status Free(absl::Span<const LogicalPage> pages);

  const CpLayout& layout() const { return layout_; }
  uint32_t num_lanes() const { return layout_.cp_size(); }
  int64_t pages_per_lane() const { return pages_per_lane_; }
  // Pages a lane can ever hand out: pages_per_lane - 1.
  int64_t usable_pages_per_lane() const { return pages_per_lane_ - 1; }

  LaneCounts Counts(Rank lane) const;
  int64_t available() const;  // Over all lanes.
  bool IsAllocated(LogicalPage page) const;

  // One line for out-of-memory diagnostics:
  // "device available=A (free=F + release=R) allocated=U; lane 0:
  //  available=.. (free=.. [runs .., largest ..] + release=..) | lane 1: ..."
  std::string AccountingString() const;

  // Every lane: free runs valid and inside [1, pages_per_lane), release list
  // disjoint from them and unique, allocation bitmap = complement of both.
  // O(pages). For tests and debug checks.
  absl::Status CheckInvariants() const;

  // Available (free + release) physical pages of `lane`, ascending. O(pages).
  std::vector<PhysicalPage> AvailablePhysicalPages(Rank lane) const;

 private:
  struct Lane {
    explicit Lane(int64_t pages) : free(pages), allocated(pages, false) {}
    PageRunSet free;
    std::vector<PhysicalPage> release;
    std::vector<bool> allocated;  // Indexed by physical page.
  };

  DevicePageAllocator(const CpLayout& layout, int64_t pages_per_lane);

  // REQUIRES: demand[l] <= Counts(l).available() for every lane.
  // Takes demand[l] pages per lane; returns them per lane, ascending.
  std::vector<std::vector<PhysicalPage>> TakePerLane(
      absl::Span<const int64_t> demand);
  void MergeRelease(Lane& lane);
  absl::Status ShortLanesError(absl::Span<const int64_t> demand) const;

  CpLayout layout_;
  int64_t pages_per_lane_;
  std::vector<Lane> lanes_;
};

}  // namespace hicache
