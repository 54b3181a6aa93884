#include "daemon/alloc/device_page_allocator.h"

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hicache {

namespace {
constexpr int64_t kMaxPagesPerLane = int64_t{1} << 40;
}  // namespace

absl::StatusOr<DevicePageAllocator> DevicePageAllocator::Create(
    const CpLayout& layout, int64_t total_logical_pages) {
  const int64_t c = layout.cp_size();
  if (total_logical_pages < 0 || total_logical_pages % c != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device pool size ", total_logical_pages,
                     " pages is not a non-negative multiple of cp_size ", c));
  }
  const int64_t per_lane = total_logical_pages / c;
  if (per_lane < 2 || per_lane > kMaxPagesPerLane) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device pool needs 2 to ", kMaxPagesPerLane,
        " pages per lane (page 0 is the reserved padding page), got ",
        per_lane));
  }
  return DevicePageAllocator(layout, per_lane);
}

DevicePageAllocator::DevicePageAllocator(const CpLayout& layout,
                                         int64_t pages_per_lane)
    : layout_(layout), pages_per_lane_(pages_per_lane) {
  lanes_.reserve(layout.cp_size());
  for (uint32_t l = 0; l < layout.cp_size(); ++l) {
    lanes_.emplace_back(pages_per_lane);
    lanes_.back().free.Add(PageRun{1, pages_per_lane - 1});
  }
}

LaneCounts DevicePageAllocator::Counts(Rank lane) const {
  const Lane& l = lanes_[lane];
  LaneCounts counts;
  counts.free = l.free.size();
  counts.release = static_cast<int64_t>(l.release.size());
  counts.allocated = usable_pages_per_lane() - counts.available();
  return counts;
}

int64_t DevicePageAllocator::available() const {
  int64_t total = 0;
  for (uint32_t l = 0; l < num_lanes(); ++l) total += Counts(l).available();
  return total;
}

bool DevicePageAllocator::IsAllocated(LogicalPage page) const {
  if (page < 0 || page >= pages_per_lane_ * num_lanes()) return false;
  return lanes_[layout_.LaneOf(page)].allocated[layout_.PhysicalPageOf(page)];
}

void DevicePageAllocator::MergeRelease(Lane& lane) {
  if (lane.release.empty()) return;
  std::sort(lane.release.begin(), lane.release.end());
  PageRun run{lane.release[0], 1};
  for (size_t i = 1; i < lane.release.size(); ++i) {
    if (lane.release[i] == run.end()) {
      ++run.length;
    } else {
      lane.free.Add(run);
      run = PageRun{lane.release[i], 1};
    }
  }
  lane.free.Add(run);
  lane.release.clear();
}

std::vector<std::vector<PhysicalPage>> DevicePageAllocator::TakePerLane(
    absl::Span<const int64_t> demand) {
  std::vector<std::vector<PhysicalPage>> taken(num_lanes());
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    if (demand[l] == 0) continue;
    Lane& lane = lanes_[l];
    // Merge freed pages when the free runs cannot serve the demand in one
    // run: either there are too few pages, or merging may create a longer run.
    if (lane.free.size() < demand[l] || lane.free.largest_run() < demand[l]) {
      MergeRelease(lane);
    }
    taken[l].reserve(demand[l]);
    lane.free.TakeContiguousPreferred(demand[l], &taken[l]);
    for (PhysicalPage p : taken[l]) lane.allocated[p] = true;
  }
  return taken;
}

absl::Status DevicePageAllocator::ShortLanesError(
    absl::Span<const int64_t> demand) const {
  std::vector<std::string> short_lanes;
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    const int64_t available = Counts(l).available();
    if (demand[l] > available) {
      short_lanes.push_back(absl::StrCat("lane ", l, " needs ", demand[l],
                                         " has ", available));
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("device allocation: ", absl::StrJoin(short_lanes, ", "),
                   "; ", AccountingString()));
}

absl::StatusOr<std::vector<LogicalPage>>
DevicePageAllocator::AllocateWithOwners(absl::Span<const Rank> owners) {
  if (absl::Status valid = layout_.ValidateOwners(owners); !valid.ok()) {
    return valid;
  }
  std::vector<int64_t> demand(num_lanes(), 0);
  for (Rank owner : owners) ++demand[owner];
  bool short_lane = false;
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    if (demand[l] > usable_pages_per_lane()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "owner pattern needs ", demand[l], " pages in lane ", l,
          ", more than the lane's ", usable_pages_per_lane()));
    }
    short_lane |= demand[l] > Counts(l).available();
  }
  if (short_lane) return ShortLanesError(demand);

  std::vector<std::vector<PhysicalPage>> taken = TakePerLane(demand);
  std::vector<size_t> next(num_lanes(), 0);
  std::vector<LogicalPage> pages;
  pages.reserve(owners.size());
  for (Rank owner : owners) {
    pages.push_back(layout_.LogicalPageOf(owner, taken[owner][next[owner]++]));
  }
  return pages;
}

absl::StatusOr<std::vector<LogicalPage>> DevicePageAllocator::Allocate(
    int64_t n) {
  if (n < 0 || n > usable_pages_per_lane() * num_lanes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device allocation of ", n, " pages is outside [0, ",
                     usable_pages_per_lane() * num_lanes(), "]"));
  }
  if (n > available()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device allocation of ", n, " pages: ", AccountingString()));
  }
  // Water-fill: each page goes to the lane with the most pages left.
  std::vector<int64_t> demand(num_lanes(), 0);
  std::priority_queue<std::pair<int64_t, int64_t>> left;  // (left, -lane)
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    left.push({Counts(l).available(), -static_cast<int64_t>(l)});
  }
  for (int64_t i = 0; i < n; ++i) {
    auto [count, neg_lane] = left.top();
    left.pop();
    ++demand[-neg_lane];
    left.push({count - 1, neg_lane});
  }
  std::vector<std::vector<PhysicalPage>> taken = TakePerLane(demand);
  std::vector<LogicalPage> pages;
  pages.reserve(n);
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    for (PhysicalPage p : taken[l]) pages.push_back(layout_.LogicalPageOf(l, p));
  }
  std::sort(pages.begin(), pages.end());
  return pages;
}

absl::Status DevicePageAllocator::Free(absl::Span<const LogicalPage> pages) {
  const int64_t total = pages_per_lane_ * num_lanes();
  // ToSortedRuns checks range and duplicates without mutating anything.
  absl::StatusOr<std::vector<PageRun>> runs =
      ToSortedRuns(pages, 0, total, "device free");
  if (!runs.ok()) return runs.status();
  for (LogicalPage page : pages) {
    const Rank lane = layout_.LaneOf(page);
    const PhysicalPage physical = layout_.PhysicalPageOf(page);
    if (physical == CpLayout::kReservedPhysicalPage) {
      return absl::InvalidArgumentError(
          absl::StrCat("device free: page ", page,
                       " is the reserved padding page of lane ", lane));
    }
    if (!lanes_[lane].allocated[physical]) {
      return absl::InvalidArgumentError(
          absl::StrCat("device free: page ", page,
                       " is not allocated (double free or never allocated)"));
    }
  }
  for (LogicalPage page : pages) {
    Lane& lane = lanes_[layout_.LaneOf(page)];
    const PhysicalPage physical = layout_.PhysicalPageOf(page);
    lane.allocated[physical] = false;
    lane.release.push_back(physical);
  }
  return absl::OkStatus();
}

std::string DevicePageAllocator::AccountingString() const {
  int64_t free = 0;
  int64_t release = 0;
  int64_t allocated = 0;
  std::vector<std::string> lanes;
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    const LaneCounts c = Counts(l);
    free += c.free;
    release += c.release;
    allocated += c.allocated;
    lanes.push_back(absl::StrCat(
        "lane ", l, ": available=", c.available(), " (free=", c.free,
        " [runs ", lanes_[l].free.num_runs(), ", largest ",
        lanes_[l].free.largest_run(), "] + release=", c.release, ")"));
  }
  return absl::StrCat("device available=", free + release, " (free=", free,
                      " + release=", release, ") allocated=", allocated, "; ",
                      absl::StrJoin(lanes, " | "));
}

absl::Status DevicePageAllocator::CheckInvariants() const {
  for (uint32_t l = 0; l < num_lanes(); ++l) {
    const Lane& lane = lanes_[l];
    if (absl::Status s = lane.free.CheckInvariants(); !s.ok()) {
      return absl::InternalError(absl::StrCat("lane ", l, ": ", s.message()));
    }
    std::vector<int> state(pages_per_lane_, 0);  // 1 free, 2 release.
    bool bad_range = false;
    lane.free.ForEachRun([&](PageRun run) {
      if (run.start < 1) bad_range = true;
      for (int64_t p = run.start; p < run.end() && !bad_range; ++p) {
        state[p] = 1;
      }
    });
    if (bad_range) {
      return absl::InternalError(
          absl::StrCat("lane ", l, ": reserved page 0 is in the free runs"));
    }
    for (PhysicalPage p : lane.release) {
      if (p < 1 || p >= pages_per_lane_ || state[p] != 0) {
        return absl::InternalError(absl::StrCat(
            "lane ", l, ": release page ", p, " out of range or duplicated"));
      }
      state[p] = 2;
    }
    if (lane.allocated[0]) {
      return absl::InternalError(
          absl::StrCat("lane ", l, ": reserved page 0 marked allocated"));
    }
    for (int64_t p = 1; p < pages_per_lane_; ++p) {
      if (lane.allocated[p] != (state[p] == 0)) {
        return absl::InternalError(absl::StrCat(
            "lane ", l, ": page ", p, " allocated bit disagrees with lists"));
      }
    }
  }
  return absl::OkStatus();
}

std::vector<PhysicalPage> DevicePageAllocator::AvailablePhysicalPages(
    Rank lane) const {
  std::vector<PhysicalPage> pages(lanes_[lane].release);
  lanes_[lane].free.ForEachRun([&](PageRun run) {
    for (int64_t p = run.start; p < run.end(); ++p) pages.push_back(p);
  });
  std::sort(pages.begin(), pages.end());
  return pages;
}

}  // namespace hicache
