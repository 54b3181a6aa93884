#include "daemon/alloc/page_run_set.h"

#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<PageRun> Runs(const PageRunSet& set) {
  std::vector<PageRun> runs;
  set.ForEachRun([&](PageRun r) { runs.push_back(r); });
  return runs;
}

TEST(ToSortedRunsTest, GroupsAndValidates) {
  auto runs = ToSortedRuns({7, 3, 4, 5, 9, 8}, 0, 10, "t");
  ASSERT_TRUE(runs.ok());
  EXPECT_THAT(*runs, ElementsAre(PageRun{3, 3}, PageRun{7, 3}));
  EXPECT_THAT(ToSortedRuns({1, 10}, 0, 10, "t").status().message(),
              HasSubstr("page 10 is outside [0, 10)"));
  EXPECT_THAT(ToSortedRuns({0}, 1, 10, "t").status().message(),
              HasSubstr("page 0 is outside"));
  EXPECT_THAT(ToSortedRuns({4, 2, 4}, 0, 10, "t").status().message(),
              HasSubstr("page 4 appears more than once"));
  EXPECT_THAT(ToSortedRuns({-1}, 0, 10, "t").status().message(),
              HasSubstr("page -1"));
  EXPECT_TRUE(ToSortedRuns({}, 0, 10, "t")->empty());
}

TEST(PageRunSetTest, AddCoalescesBothSides) {
  PageRunSet set(100);
  set.Add({10, 5});
  set.Add({20, 5});
  EXPECT_EQ(set.num_runs(), 2);
  set.Add({15, 5});  // Bridges the gap.
  EXPECT_THAT(Runs(set), ElementsAre(PageRun{10, 15}));
  EXPECT_EQ(set.size(), 15);
  EXPECT_EQ(set.largest_run(), 15);
  EXPECT_TRUE(set.Contains(24));
  EXPECT_FALSE(set.Contains(25));
  EXPECT_TRUE(set.Overlaps({0, 11}));
  EXPECT_FALSE(set.Overlaps({0, 10}));
  EXPECT_TRUE(set.CheckInvariants().ok());
}

TEST(PageRunSetTest, BestFitPrefersSmallestSufficientRun) {
  PageRunSet set(100);
  set.Add({0, 10});
  set.Add({20, 4});
  set.Add({30, 6});
  EXPECT_EQ(set.TakeBestFitRun(5), 30);  // 6 fits better than 10.
  EXPECT_THAT(Runs(set),
              ElementsAre(PageRun{0, 10}, PageRun{20, 4}, PageRun{35, 1}));
  EXPECT_EQ(set.TakeBestFitRun(11), std::nullopt);
  EXPECT_TRUE(set.CheckInvariants().ok());
}

TEST(PageRunSetTest, ContiguousPreferredUsesFewestRuns) {
  PageRunSet set(100);
  set.Add({0, 2});
  set.Add({10, 5});
  set.Add({20, 3});
  set.Add({30, 1});
  std::vector<int64_t> out;
  set.TakeContiguousPreferred(7, &out);  // 5 + best fit of 2 (the 2-run).
  EXPECT_THAT(out, ElementsAre(0, 1, 10, 11, 12, 13, 14));
  EXPECT_THAT(Runs(set), ElementsAre(PageRun{20, 3}, PageRun{30, 1}));
  out.clear();
  set.TakeContiguousPreferred(4, &out);
  EXPECT_THAT(out, ElementsAre(20, 21, 22, 30));
  EXPECT_TRUE(set.empty());
  EXPECT_TRUE(set.CheckInvariants().ok());
}

// Randomized against a plain std::set of pages.
TEST(PageRunSetTest, MatchesNaiveModel) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    constexpr int64_t kCapacity = 512;
    PageRunSet set(kCapacity);
    std::set<int64_t> model;
    for (int step = 0; step < 20000; ++step) {
      if (rng() % 2 == 0) {
        const int64_t start = rng() % kCapacity;
        const int64_t length =
            1 + rng() % std::min<int64_t>(16, kCapacity - start);
        bool overlap = false;
        for (int64_t p = start; p < start + length; ++p) {
          overlap |= model.count(p) > 0;
        }
        ASSERT_EQ(set.Overlaps({start, length}), overlap);
        if (!overlap) {
          set.Add({start, length});
          for (int64_t p = start; p < start + length; ++p) model.insert(p);
        }
      } else if (!model.empty()) {
        const int64_t n = 1 + rng() % std::min<int64_t>(40, model.size());
        const int64_t largest_before = set.largest_run();
        std::vector<int64_t> out;
        set.TakeContiguousPreferred(n, &out);
        ASSERT_EQ(out.size(), static_cast<size_t>(n));
        if (n <= largest_before) {
          for (int64_t i = 1; i < n; ++i) ASSERT_EQ(out[i], out[i - 1] + 1);
        }
        for (int64_t p : out) ASSERT_EQ(model.erase(p), 1u) << p;
      }
      ASSERT_EQ(set.size(), static_cast<int64_t>(model.size()));
      ASSERT_TRUE(set.CheckInvariants().ok()) << set.CheckInvariants();
    }
  }
}

}  // namespace
}  // namespace hicache
