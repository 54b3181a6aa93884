#include "daemon/alloc/device_page_allocator.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CpLayout Layout(uint32_t c) { return *CpLayout::Create(64, c); }

TEST(DevicePageAllocatorTest, RejectsBadPoolSizes) {
  EXPECT_THAT(DevicePageAllocator::Create(Layout(4), 30).status().message(),
              HasSubstr("not a non-negative multiple of cp_size 4"));
  EXPECT_THAT(DevicePageAllocator::Create(Layout(4), 4).status().message(),
              HasSubstr("reserved padding page"));
  EXPECT_FALSE(DevicePageAllocator::Create(Layout(2), -2).ok());
  EXPECT_TRUE(DevicePageAllocator::Create(Layout(4), 8).ok());
}

TEST(DevicePageAllocatorTest, FreshPoolExcludesReservedPages) {
  auto alloc = *DevicePageAllocator::Create(Layout(4), 40);
  EXPECT_EQ(alloc.usable_pages_per_lane(), 9);
  EXPECT_EQ(alloc.available(), 36);
  auto pages = *alloc.Allocate(36);
  for (LogicalPage p : pages) EXPECT_GE(p, 4);  // Never logical 0..C-1.
  EXPECT_EQ(alloc.Allocate(1).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(DevicePageAllocatorTest, OwnersAreMatchedExactlyAndContiguously) {
  const CpLayout layout = Layout(4);
  auto alloc = *DevicePageAllocator::Create(layout, 4 * 64);
  const std::vector<Rank> owners = ZigzagComputeOwners(10, 4);
  auto pages = *alloc.AllocateWithOwners(owners);
  ASSERT_EQ(pages.size(), owners.size());
  std::map<Rank, std::vector<PhysicalPage>> per_lane;
  for (size_t i = 0; i < pages.size(); ++i) {
    EXPECT_EQ(layout.LaneOf(pages[i]), owners[i]) << i;
    per_lane[owners[i]].push_back(layout.PhysicalPageOf(pages[i]));
  }
  // Fresh pool: each lane's pages are consecutive physical pages from 1.
  EXPECT_THAT(per_lane[0], ElementsAre(1, 2, 3));
  EXPECT_THAT(per_lane[1], ElementsAre(1, 2, 3));
  EXPECT_THAT(per_lane[2], ElementsAre(1, 2));
  EXPECT_THAT(per_lane[3], ElementsAre(1, 2));
  // Worked example of docs/cp-layout.md.
  EXPECT_THAT(pages, ElementsAre(4, 8, 5, 9, 6, 7, 11, 10, 13, 12));
}

TEST(DevicePageAllocatorTest, AllOrNothingWhenOneLaneIsShort) {
  auto alloc = *DevicePageAllocator::Create(Layout(2), 2 * 5);
  auto lane0 = *alloc.AllocateWithOwners({0, 0, 0});
  const std::string before = alloc.AccountingString();
  auto failed = alloc.AllocateWithOwners({1, 0, 1, 0});
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(failed.status().message(), HasSubstr("lane 0 needs 2 has 1"));
  EXPECT_EQ(alloc.AccountingString(), before);
  EXPECT_EQ(alloc.Counts(1).available(), 4);
  EXPECT_TRUE(alloc.CheckInvariants().ok());
}

TEST(DevicePageAllocatorTest, BadInputIsInvalidArgumentAndChangesNothing) {
  const CpLayout layout = Layout(4);
  auto alloc = *DevicePageAllocator::Create(layout, 4 * 8);
  auto pages = *alloc.AllocateWithOwners({0, 1, 2, 3});
  const std::string before = alloc.AccountingString();
  EXPECT_THAT(alloc.AllocateWithOwners({0, 4}).status().message(),
              HasSubstr("owners[1] = 4"));
  EXPECT_THAT(
      alloc.AllocateWithOwners(std::vector<Rank>(8, 2)).status().message(),
      HasSubstr("more than the lane's 7"));
  EXPECT_EQ(alloc.Allocate(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc.Allocate(int64_t{1} << 62).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(alloc.Free({pages[0], 2}).message(),
              HasSubstr("reserved padding page"));
  EXPECT_THAT(alloc.Free({pages[0], pages[0]}).message(),
              HasSubstr("more than once"));
  EXPECT_THAT(alloc.Free({pages[0], 32}).message(), HasSubstr("outside"));
  EXPECT_THAT(alloc.Free({-3}).message(), HasSubstr("outside"));
  EXPECT_THAT(alloc.Free({pages[1], 29}).message(),
              HasSubstr("page 29 is not allocated"));
  EXPECT_EQ(alloc.AccountingString(), before);
  for (LogicalPage p : pages) EXPECT_TRUE(alloc.IsAllocated(p));
  ASSERT_TRUE(alloc.Free(pages).ok());
  EXPECT_THAT(alloc.Free({pages[2]}).message(), HasSubstr("double free"));
}

TEST(DevicePageAllocatorTest, FreedPagesWaitInReleaseUntilNeeded) {
  auto alloc = *DevicePageAllocator::Create(Layout(1), 10);
  auto a = *alloc.Allocate(3);  // Physical 1..3.
  ASSERT_TRUE(alloc.Free(a).ok());
  EXPECT_EQ(alloc.Counts(0).release, 3);
  EXPECT_EQ(alloc.Counts(0).free, 6);
  EXPECT_THAT(alloc.AccountingString(),
              HasSubstr("lane 0: available=9 (free=6 [runs 1, largest 6] + "
                        "release=3)"));
  // 6 free pages serve 4 contiguously without merging.
  EXPECT_THAT(*alloc.Allocate(4), ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(alloc.Counts(0).release, 3);
  // Now the free runs are too short: the release list is merged.
  EXPECT_THAT(*alloc.Allocate(4), ElementsAre(1, 2, 3, 8));
  EXPECT_EQ(alloc.Counts(0).release, 0);
  EXPECT_TRUE(alloc.CheckInvariants().ok());
}

TEST(DevicePageAllocatorTest, AllocateBalancesLanes) {
  const CpLayout layout = Layout(4);
  auto alloc = *DevicePageAllocator::Create(layout, 4 * 10);
  ASSERT_TRUE(alloc.AllocateWithOwners({0, 0, 0, 0, 0}).ok());
  auto pages = *alloc.Allocate(7);
  std::vector<int> per_lane(4, 0);
  for (LogicalPage p : pages) ++per_lane[layout.LaneOf(p)];
  // Lane 0 has 4 left, the others 9: lanes 1..3 absorb the 7 pages.
  EXPECT_EQ(per_lane[0], 0);
  EXPECT_EQ(per_lane[1] + per_lane[2] + per_lane[3], 7);
  EXPECT_LE(*std::max_element(per_lane.begin() + 1, per_lane.end()) -
                *std::min_element(per_lane.begin() + 1, per_lane.end()),
            1);
  EXPECT_TRUE(std::is_sorted(pages.begin(), pages.end()));
}

// Randomized model test against plain per-lane sets, with the invariant
// checker after every step: 100k operations per seed.
class DeviceModelTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(DeviceModelTest, MatchesNaiveModel) {
  const uint32_t c = GetParam();
  const CpLayout layout = Layout(c);
  constexpr int64_t kPagesPerLane = 64;
  for (uint64_t seed : {101u, 202u}) {
    std::mt19937_64 rng(seed * 31 + c);
    auto alloc = *DevicePageAllocator::Create(layout, kPagesPerLane * c);
    std::vector<std::set<PhysicalPage>> available(c);  // The model.
    for (Rank l = 0; l < c; ++l) {
      for (PhysicalPage p = 1; p < kPagesPerLane; ++p) available[l].insert(p);
    }
    std::vector<std::vector<LogicalPage>> held;
    auto take = [&](const std::vector<LogicalPage>& pages) {
      for (LogicalPage page : pages) {
        ASSERT_EQ(
            available[layout.LaneOf(page)].erase(layout.PhysicalPageOf(page)),
            1u)
            << "page " << page << " was not available";
      }
      held.push_back(pages);
    };
    for (int step = 0; step < 100000; ++step) {
      const int op = rng() % 10;
      if (op < 4) {
        std::vector<Rank> owners(rng() % 24);
        for (Rank& o : owners) o = rng() % c;
        std::vector<int64_t> demand(c, 0);
        for (Rank o : owners) ++demand[o];
        bool fits = true;
        for (Rank l = 0; l < c; ++l) {
          fits &= demand[l] <= static_cast<int64_t>(available[l].size());
        }
        auto pages = alloc.AllocateWithOwners(owners);
        ASSERT_EQ(pages.ok(), fits) << pages.status();
        if (!fits) {
          ASSERT_EQ(pages.status().code(),
                    absl::StatusCode::kResourceExhausted);
        } else {
          ASSERT_EQ(layout.OwnersOf(*pages), owners);
          ASSERT_NO_FATAL_FAILURE(take(*pages));
        }
      } else if (op < 6) {
        const int64_t n = rng() % 24;
        int64_t total = 0;
        for (const auto& lane : available) total += lane.size();
        auto pages = alloc.Allocate(n);
        ASSERT_EQ(pages.ok(), n <= total);
        if (pages.ok()) {
          ASSERT_EQ(pages->size(), static_cast<size_t>(n));
          ASSERT_NO_FATAL_FAILURE(take(*pages));
        }
      } else if (op < 9 && !held.empty()) {
        const size_t i = rng() % held.size();
        ASSERT_TRUE(alloc.Free(held[i]).ok());
        for (LogicalPage page : held[i]) {
          available[layout.LaneOf(page)].insert(layout.PhysicalPageOf(page));
        }
        held[i] = held.back();
        held.pop_back();
      } else {
        // Bad frees: a held batch plus a page that is available or reserved.
        std::vector<LogicalPage> bad = held.empty() ? std::vector<LogicalPage>{}
                                                    : held[rng() % held.size()];
        const Rank lane = rng() % c;
        bad.push_back(
            available[lane].empty()
                ? layout.LogicalPageOf(lane, 0)
                : layout.LogicalPageOf(lane, *available[lane].begin()));
        ASSERT_EQ(alloc.Free(bad).code(), absl::StatusCode::kInvalidArgument);
      }
      ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants();
      for (Rank l = 0; l < c; ++l) {
        ASSERT_EQ(alloc.Counts(l).available(),
                  static_cast<int64_t>(available[l].size()));
      }
    }
    for (Rank l = 0; l < c; ++l) {
      const std::vector<PhysicalPage> actual = alloc.AvailablePhysicalPages(l);
      ASSERT_EQ(std::set<PhysicalPage>(actual.begin(), actual.end()),
                available[l]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpSizes, DeviceModelTest,
                         ::testing::Values(1u, 2u, 3u, 4u, 8u));

}  // namespace
}  // namespace hicache
