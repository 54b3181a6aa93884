#include "daemon/layout/cp_layout.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CpLayout MakeLayout(uint32_t page_size, uint32_t cp_size) {
  absl::StatusOr<CpLayout> layout = CpLayout::Create(page_size, cp_size);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// Naive reference: segment boundaries by cumulative sum, then a linear search.
std::vector<Rank> ReferenceZigzag(int64_t n, uint32_t c) {
  std::vector<int64_t> ends;
  int64_t end = 0;
  for (int64_t s = 0; s < 2 * c; ++s) {
    end += n / (2 * c) + (s < n % (2 * c) ? 1 : 0);
    ends.push_back(end);
  }
  std::vector<Rank> owners;
  for (int64_t i = 0; i < n; ++i) {
    int64_t s = 0;
    while (ends[s] <= i) ++s;
    owners.push_back(static_cast<Rank>(std::min<int64_t>(s, 2 * c - 1 - s)));
  }
  return owners;
}

TEST(CpLayoutTest, RejectsBadConfiguration) {
  EXPECT_THAT(CpLayout::Create(48, 2).status().message(),
              HasSubstr("page_size must be a power of two"));
  EXPECT_EQ(CpLayout::Create(0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(CpLayout::Create(64, 0).status().message(), HasSubstr("cp_size"));
  EXPECT_THAT(CpLayout::Create(64, 4, {0, 4}).status().message(),
              HasSubstr("served_ranks"));
  EXPECT_FALSE(CpLayout::Create(64, 4, {2, 1}).ok());
  EXPECT_FALSE(CpLayout::Create(64, 4, {1, 1}).ok());
}

TEST(CpLayoutTest, ServedRanksDefaultToAll) {
  CpLayout layout = MakeLayout(64, 3);
  EXPECT_THAT(layout.served_ranks(), ElementsAre(0, 1, 2));
  CpLayout partial = *CpLayout::Create(64, 4, {1, 3});
  EXPECT_TRUE(partial.Serves(3));
  EXPECT_FALSE(partial.Serves(0));
}

// Exhaustive over C <= 8 and the first pages of every lane.
TEST(CpLayoutTest, LanesAndPhysicalPagesRoundTrip) {
  for (uint32_t c = 1; c <= 8; ++c) {
    CpLayout layout = MakeLayout(64, c);
    std::set<std::pair<Rank, PhysicalPage>> seen;
    for (LogicalPage page = 0; page < 64 * c; ++page) {
      const Rank lane = layout.LaneOf(page);
      const PhysicalPage phys = layout.PhysicalPageOf(page);
      EXPECT_EQ(lane, page % c);
      EXPECT_EQ(phys, page / c);
      EXPECT_EQ(layout.LogicalPageOf(lane, phys), page);
      EXPECT_TRUE(seen.insert({lane, phys}).second) << "collision at " << page;
      EXPECT_EQ(layout.IsReserved(page), page < c);
    }
  }
}

TEST(CpLayoutTest, LocationsRoundTripForEveryPageSize) {
  for (uint32_t p : {1u, 2u, 4u, 16u, 64u}) {
    for (uint32_t c = 1; c <= 8; ++c) {
      CpLayout layout = MakeLayout(p, c);
      for (TokenLoc loc = 0; loc < 8 * p * c; ++loc) {
        const PhysicalLoc phys = layout.ToPhysical(loc);
        const LogicalPage page = loc / p;
        EXPECT_EQ(phys.lane, page % c);
        EXPECT_EQ(phys.loc, (page / c) * p + loc % p);
        EXPECT_EQ(layout.ToLogical(phys), loc);
      }
    }
  }
}

TEST(CpLayoutTest, CheckedConversionsRejectBadInput) {
  CpLayout layout = MakeLayout(64, 4);
  EXPECT_EQ(layout.CheckedToPhysical(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.CheckedToLogical({4, 0}).status().message(),
              HasSubstr("lane 4"));
  EXPECT_FALSE(layout.CheckedToLogical({0, -5}).ok());
  EXPECT_FALSE(layout.CheckedToLogical({0, INT64_MAX}).ok());
  EXPECT_EQ(*layout.CheckedToLogical({1, 70}), (1 * 4 + 1) * 64 + 6);
}

TEST(CpLayoutTest, ZigzagMatchesReferenceExhaustively) {
  for (uint32_t c = 1; c <= 8; ++c) {
    CpLayout layout = MakeLayout(64, c);
    for (int64_t n = 0; n <= 80; ++n) {
      const std::vector<Rank> owners =
          layout.ComputeOwners(n, ComputeOwnerMode::kZigzag);
      ASSERT_EQ(owners, ReferenceZigzag(n, c)) << "C=" << c << " N=" << n;
      // Rank r's page count is the sum of segments r and 2C-1-r.
      for (Rank r = 0; r < c; ++r) {
        const int64_t expected = n / (2 * c) * 2 + (r < n % (2 * c) ? 1 : 0) +
                                 (2 * c - 1 - r < n % (2 * c) ? 1 : 0);
        EXPECT_EQ(std::count(owners.begin(), owners.end(), r), expected);
      }
    }
  }
}

TEST(CpLayoutTest, ZigzagWorkedExample) {
  // C = 4, N = 10: 8 segments, lengths 2,2,1,1,1,1,1,1.
  EXPECT_THAT(ZigzagComputeOwners(10, 4),
              ElementsAre(0, 0, 1, 1, 2, 3, 3, 2, 1, 0));
}

TEST(CpLayoutTest, RoundRobin) {
  CpLayout layout = MakeLayout(64, 3);
  EXPECT_THAT(layout.ComputeOwners(7, ComputeOwnerMode::kRoundRobin),
              ElementsAre(0, 1, 2, 0, 1, 2, 0));
  EXPECT_TRUE(layout.ComputeOwners(0, ComputeOwnerMode::kRoundRobin).empty());
  EXPECT_TRUE(layout.ComputeOwners(-3, ComputeOwnerMode::kZigzag).empty());
}

TEST(CpLayoutTest, OwnedPositionsPartitionARun) {
  for (uint32_t c = 1; c <= 8; ++c) {
    CpLayout layout = MakeLayout(4, c);
    std::vector<LogicalPage> pages = {9, 2, 17, 3, 30, 31};
    const std::vector<TokenLoc> locs = layout.LocsOfPages(pages, 22);
    ASSERT_EQ(locs.size(), 22u);
    std::vector<int> hits(locs.size(), 0);
    for (Rank r = 0; r < c; ++r) {
      const std::vector<int64_t> positions = layout.OwnedPositions(locs, r);
      const std::vector<int64_t> physical = layout.OwnedPhysicalLocs(locs, r);
      ASSERT_EQ(positions.size(), physical.size());
      EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end()));
      for (size_t k = 0; k < positions.size(); ++k) {
        ++hits[positions[k]];
        EXPECT_EQ(layout.LaneOf(locs[positions[k]] / 4), r);
        EXPECT_EQ(layout.ToLogical({r, physical[k]}), locs[positions[k]]);
      }
    }
    for (int h : hits) EXPECT_EQ(h, 1);
  }
}

TEST(CpLayoutTest, LocsOfPagesStopsAtValidTokens) {
  CpLayout layout = MakeLayout(4, 2);
  EXPECT_THAT(layout.LocsOfPages({3, 5}, 6),
              ElementsAre(12, 13, 14, 15, 20, 21));
  EXPECT_THAT(layout.OwnersOf({3, 5, 6}), ElementsAre(1, 1, 0));
}

TEST(CpLayoutTest, ValidateOwners) {
  CpLayout layout = MakeLayout(64, 4);
  EXPECT_TRUE(layout.ValidateOwners({0, 3, 2}).ok());
  absl::Status status = layout.ValidateOwners({0, 3, 4});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("owners[2] = 4"));
}

}  // namespace
}  // namespace hicache
