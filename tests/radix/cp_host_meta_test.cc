#include "daemon/radix/cp_host_meta.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CpHostMetaTest, ValidatesConstruction) {
  // 10 tokens at P = 4: 3 pages owned by ranks 0, 1, 0.
  EXPECT_TRUE(CpHostMeta::Create(10, 4, 2, {0, 1, 0}, {{7, 8}, {3}}).ok());
  EXPECT_THAT(
      CpHostMeta::Create(10, 4, 2, {0, 1}, {{7}, {3}}).status().message(),
      HasSubstr("needs 3"));
  EXPECT_THAT(
      CpHostMeta::Create(10, 4, 2, {0, 2, 0}, {{7, 8}, {3}}).status().message(),
      HasSubstr("page_owners[1] = 2"));
  EXPECT_THAT(
      CpHostMeta::Create(10, 4, 2, {0, 1, 0}, {{7}, {3}}).status().message(),
      HasSubstr("rank 0 owns 2 pages but has 1"));
  EXPECT_FALSE(CpHostMeta::Create(0, 4, 1, {}, {{}}).ok());
  EXPECT_FALSE(CpHostMeta::Create(4, 3, 1, {0}, {{1}}).ok());
  EXPECT_FALSE(CpHostMeta::Create(4, 4, 1, {0}, {{-1}}).ok());
}

TEST(CpHostMetaTest, ZeroOwnedRankIsValid) {
  // C = 4 but only ranks 0 and 2 own pages: ranks 1 and 3 hold nothing.
  auto meta = CpHostMeta::Create(8, 4, 4, {2, 0}, {{5}, {}, {9}, {}});
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->host_pages(1).empty());
  EXPECT_TRUE(meta->OwnedTokenPositions(3).empty());
  EXPECT_THAT(meta->OwnedPagePositions(2), ElementsAre(0));
  EXPECT_THAT(meta->OwnedTokenPositions(0), ElementsAre(4, 5, 6, 7));
}

TEST(CpHostMetaTest, FromOwnedTokenPositions) {
  // 6 tokens at P = 4: rank 1 owns page 0 (tokens 0..3), rank 0 page 1 (4, 5).
  auto meta = CpHostMeta::FromOwnedTokenPositions(
      6, 4, 2, {1, 0}, {{4, 5}, {0, 1, 2, 3}}, {{11}, {12}});
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_THAT(CpHostMeta::FromOwnedTokenPositions(
                  6, 4, 2, {1, 0}, {{5, 4}, {0, 1, 2, 3}}, {{11}, {12}})
                  .status()
                  .message(),
              HasSubstr("not sorted"));
  EXPECT_THAT(CpHostMeta::FromOwnedTokenPositions(
                  6, 4, 2, {1, 0}, {{4, 6}, {0, 1, 2, 3}}, {{11}, {12}})
                  .status()
                  .message(),
              HasSubstr("inside [0, 6)"));
  EXPECT_THAT(CpHostMeta::FromOwnedTokenPositions(
                  6, 4, 2, {1, 0}, {{4}, {0, 1, 2, 3}}, {{11}, {12}})
                  .status()
                  .message(),
              HasSubstr("disagree"));
}

TEST(CpHostMetaTest, SplitRebasesAndSplitsOwnersByPage) {
  // 14 tokens at P = 4: pages owned 0, 1, 1, 0; host pages in order.
  auto meta = *CpHostMeta::Create(14, 4, 2, {0, 1, 1, 0}, {{10, 13}, {11, 12}});
  auto halves = meta.Split(8);
  ASSERT_TRUE(halves.ok()) << halves.status();
  const auto& [head, tail] = *halves;
  EXPECT_EQ(head.logical_len(), 8);
  EXPECT_THAT(head.page_owners(), ElementsAre(0, 1));
  EXPECT_THAT(head.host_pages(0), ElementsAre(10));
  EXPECT_THAT(head.host_pages(1), ElementsAre(11));
  EXPECT_EQ(tail.logical_len(), 6);
  EXPECT_THAT(tail.page_owners(), ElementsAre(1, 0));
  EXPECT_THAT(tail.host_pages(0), ElementsAre(13));
  EXPECT_THAT(tail.host_pages(1), ElementsAre(12));
  EXPECT_THAT(tail.OwnedTokenPositions(0), ElementsAre(4, 5));  // Rebased.
}

TEST(CpHostMetaTest, InvalidSplitIsAnError) {
  auto meta = *CpHostMeta::Create(14, 4, 1, {0, 0, 0, 0}, {{1, 2, 3, 4}});
  EXPECT_THAT(meta.Split(6).status().message(), HasSubstr("page boundary"));
  // Not the seed's split at 0 into an empty head (cp_host_meta.h).
  EXPECT_EQ(meta.Split(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(meta.Split(14).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(meta.Split(16).ok());  // Inside the padded tail page.
  EXPECT_TRUE(meta.Split(12).ok());
}

}  // namespace
}  // namespace hicache
