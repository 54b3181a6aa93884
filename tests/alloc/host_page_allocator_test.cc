#include "daemon/alloc/host_page_allocator.h"

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(HostPageAllocatorTest, RejectsBadSizes) {
  EXPECT_EQ(HostPageAllocator::Create(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(HostPageAllocator::Create(int64_t{1} << 41).ok());
  auto empty = HostPageAllocator::Create(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->Reserve(0)->empty());
  EXPECT_EQ(empty->Reserve(1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HostPageAllocatorTest, ReserveIsContiguousWhenPossible) {
  auto alloc = *HostPageAllocator::Create(16);
  EXPECT_THAT(*alloc.Reserve(4), ElementsAre(0, 1, 2, 3));
  auto middle = *alloc.Reserve(4);
  EXPECT_THAT(middle, ElementsAre(4, 5, 6, 7));
  ASSERT_TRUE(alloc.Free(middle).ok());
  // A 3-page request takes the 4-run hole (best fit), not the 8-run tail.
  EXPECT_THAT(*alloc.Reserve(3), ElementsAre(4, 5, 6));
  EXPECT_EQ(alloc.free_pages(), 9);
  EXPECT_EQ(alloc.num_free_runs(), 1);  // Page 7 joins 8..15.
}

TEST(HostPageAllocatorTest, FragmentedReserveUsesFewestRuns) {
  auto alloc = *HostPageAllocator::Create(20);
  auto all = *alloc.Reserve(20);
  // Free runs of 1, 3 and 5 pages.
  ASSERT_TRUE(alloc.Free({0, 4, 5, 6, 10, 11, 12, 13, 14}).ok());
  auto pages = *alloc.Reserve(8);  // 5 + 3.
  EXPECT_THAT(pages, ElementsAre(4, 5, 6, 10, 11, 12, 13, 14));
  EXPECT_EQ(alloc.free_pages(), 1);
}

TEST(HostPageAllocatorTest, FailuresChangeNothing) {
  auto alloc = *HostPageAllocator::Create(8);
  auto pages = *alloc.Reserve(6);
  const std::string before = alloc.AccountingString();

  absl::StatusOr<std::vector<int64_t>> big = alloc.Reserve(3);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("free=2"));
  EXPECT_EQ(alloc.Reserve(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(alloc.Free({0, 7}).message(),
              HasSubstr("page 7 is not reserved"));
  EXPECT_THAT(alloc.Free({1, 1}).message(), HasSubstr("more than once"));
  EXPECT_THAT(alloc.Free({8}).message(), HasSubstr("outside"));
  EXPECT_EQ(alloc.AccountingString(), before);
  EXPECT_FALSE(alloc.IsFree(0));  // The valid page of a rejected batch too.
  EXPECT_TRUE(alloc.CheckInvariants().ok());
}

// Randomized model test: 100k operations per seed against a std::set, with
// the invariant checker after every step.
TEST(HostPageAllocatorTest, MatchesNaiveModel) {
  for (uint64_t seed : {11u, 12u, 13u}) {
    std::mt19937_64 rng(seed);
    constexpr int64_t kPages = 300;
    auto alloc = *HostPageAllocator::Create(kPages);
    std::set<int64_t> free_model;
    for (int64_t p = 0; p < kPages; ++p) free_model.insert(p);
    std::vector<std::vector<int64_t>> held;
    for (int step = 0; step < 100000; ++step) {
      const int op = rng() % 10;
      if (op < 5) {
        const int64_t n = rng() % 40;
        const int64_t largest_run = alloc.largest_free_run();
        auto pages = alloc.Reserve(n);
        if (n > static_cast<int64_t>(free_model.size())) {
          ASSERT_EQ(pages.status().code(),
                    absl::StatusCode::kResourceExhausted);
        } else {
          ASSERT_TRUE(pages.ok()) << pages.status();
          ASSERT_EQ(pages->size(), static_cast<size_t>(n));
          ASSERT_TRUE(std::is_sorted(pages->begin(), pages->end()));
          if (n <= largest_run && n > 0) {  // A run existed: must be one run.
            ASSERT_EQ(pages->back() - pages->front(), n - 1);
          }
          for (int64_t p : *pages) ASSERT_EQ(free_model.erase(p), 1u);
          held.push_back(*pages);
        }
      } else if (op < 9 && !held.empty()) {
        const size_t i = rng() % held.size();
        ASSERT_TRUE(alloc.Free(held[i]).ok());
        for (int64_t p : held[i]) free_model.insert(p);
        held[i] = held.back();
        held.pop_back();
      } else {
        // A bad batch: one free page (or an out-of-range one) among held ones.
        std::vector<int64_t> bad =
            held.empty() ? std::vector<int64_t>{} : held[rng() % held.size()];
        bad.push_back(free_model.empty() ? kPages : *free_model.begin());
        ASSERT_EQ(alloc.Free(bad).code(), absl::StatusCode::kInvalidArgument);
      }
      ASSERT_EQ(alloc.free_pages(), static_cast<int64_t>(free_model.size()));
      ASSERT_TRUE(alloc.CheckInvariants().ok());
    }
    for (int64_t p = 0; p < kPages; ++p) {
      ASSERT_EQ(alloc.IsFree(p), free_model.count(p) > 0) << p;
    }
  }
}


// Recovery reserves the exact pages a durable index records.
TEST(HostPageAllocatorTest, ReserveExactlyTakesThosePagesOrNothing) {
  HostPageAllocator alloc = *HostPageAllocator::Create(16);
  ASSERT_TRUE(alloc.ReserveExactly({3, 4, 5, 9, 15}).ok());
  EXPECT_EQ(alloc.free_pages(), 11);
  for (int64_t page : {3, 4, 5, 9, 15}) EXPECT_FALSE(alloc.IsFree(page));
  EXPECT_TRUE(alloc.IsFree(2));
  EXPECT_TRUE(alloc.IsFree(6));
  ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants();
  // Already reserved, repeated, out of range: refused, nothing changes.
  for (const std::vector<int64_t>& bad :
       std::vector<std::vector<int64_t>>{{0, 4}, {1, 1}, {16}, {-1}}) {
    const absl::Status status = alloc.ReserveExactly(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
    EXPECT_EQ(alloc.free_pages(), 11);
    EXPECT_TRUE(alloc.IsFree(0));
    EXPECT_TRUE(alloc.IsFree(1));
  }
  EXPECT_THAT(std::string(alloc.ReserveExactly({0, 4}).message()),
              HasSubstr("page 4 is already reserved"));
  // What was reserved exactly frees normally; the rest reserves normally.
  ASSERT_TRUE(alloc.Free({4, 9}).ok());
  auto rest = alloc.Reserve(13);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(alloc.free_pages(), 0);
  ASSERT_TRUE(alloc.CheckInvariants().ok());
}

// Random exact reservations and frees against a std::set model.
TEST(HostPageAllocatorTest, ReserveExactlyMatchesNaiveModel) {
  std::mt19937 rng(5);
  HostPageAllocator alloc = *HostPageAllocator::Create(200);
  std::set<int64_t> free;
  for (int64_t p = 0; p < 200; ++p) free.insert(p);
  for (int step = 0; step < 2000; ++step) {
    std::vector<int64_t> pages;
    const int n = std::uniform_int_distribution<int>(1, 6)(rng);
    const int64_t start = std::uniform_int_distribution<int64_t>(0, 199)(rng);
    for (int i = 0; i < n && start + i < 200; ++i) pages.push_back(start + i);
    if (rng() % 2 == 0) {
      const bool ok = std::all_of(pages.begin(), pages.end(),
                                  [&](int64_t p) { return free.contains(p); });
      EXPECT_EQ(alloc.ReserveExactly(pages).ok(), ok);
      if (ok) for (int64_t p : pages) free.erase(p);
    } else {
      const bool ok = std::none_of(pages.begin(), pages.end(),
                                   [&](int64_t p) { return free.contains(p); });
      EXPECT_EQ(alloc.Free(pages).ok(), ok);
      if (ok) for (int64_t p : pages) free.insert(p);
    }
    ASSERT_EQ(alloc.free_pages(), static_cast<int64_t>(free.size()));
    ASSERT_TRUE(alloc.CheckInvariants().ok()) << alloc.CheckInvariants();
  }
}

}  // namespace
}  // namespace hicache
