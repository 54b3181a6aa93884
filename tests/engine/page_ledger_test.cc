// PageLedger against a naive model: a map from page to holder, driven by
// random adds, moves and removes, with every query compared.
#include "daemon/engine/page_ledger.h"

#include <map>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

TEST(PageLedgerTest, TracksHoldersAndCounts) {
  PageLedger ledger;
  ledger.Add({1, 2, 3}, PageHolder::Request(7));
  ledger.Add({4}, PageHolder::Load(99));
  EXPECT_TRUE(ledger.IsHeldBy(2, PageHolder::Request(7)));
  EXPECT_FALSE(ledger.IsHeldBy(2, PageHolder::Request(8)));
  EXPECT_FALSE(ledger.HolderOf(5).has_value());
  ledger.Move({2, 4}, PageHolder::Tree());
  EXPECT_EQ(ledger.Count(PageHolder::Kind::kTree), 2);
  EXPECT_EQ(ledger.Count(PageHolder::Kind::kLoad), 0);
  EXPECT_THAT(ledger.PagesOfRequest(7), UnorderedElementsAreArray({1, 3}));
  ledger.Remove({1, 3});
  EXPECT_EQ(ledger.CountOfRequest(7), 0);
  EXPECT_TRUE(ledger.PagesOfRequest(7).empty());
  EXPECT_EQ(ledger.size(), 2);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(PageLedgerTest, CheckDistinctNamesTheRepeat) {
  EXPECT_TRUE(PageLedger::CheckDistinct({1, 2, 3}, "pages").ok());
  const absl::Status s = PageLedger::CheckDistinct({4, 5, 4}, "pages");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("pages[2] = 4 repeats pages[0]"));
}

TEST(PageLedgerTest, MatchesANaiveModel) {
  std::mt19937_64 rng(42);
  PageLedger ledger;
  std::map<LogicalPage, PageHolder> model;
  auto random_holder = [&] {
    switch (rng() % 3) {
      case 0:
        return PageHolder::Request(rng() % 4);
      case 1:
        return PageHolder::Tree();
      default:
        return PageHolder::Load(rng() % 3);
    }
  };
  for (int step = 0; step < 20000; ++step) {
    const LogicalPage page = static_cast<LogicalPage>(rng() % 64);
    const auto it = model.find(page);
    const PageHolder holder = random_holder();
    if (it == model.end()) {
      ledger.Add({page}, holder);
      model[page] = holder;
    } else if (rng() % 2 == 0) {
      ledger.Move({page}, holder);
      it->second = holder;
    } else {
      ledger.Remove({page});
      model.erase(it);
    }
    if (step % 500 == 0) {
      ASSERT_TRUE(ledger.CheckInvariants().ok());
    }
  }
  for (uint64_t request = 0; request < 4; ++request) {
    std::vector<LogicalPage> expected;
    for (const auto& [page, holder] : model) {
      if (holder == PageHolder::Request(request)) expected.push_back(page);
    }
    EXPECT_THAT(ledger.PagesOfRequest(request),
                UnorderedElementsAreArray(expected));
  }
  EXPECT_EQ(ledger.size(), static_cast<int64_t>(model.size()));
}

}  // namespace
}  // namespace hicache
