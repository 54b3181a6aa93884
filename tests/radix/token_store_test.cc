// TokenStore: blocks handed out, freed and reused; a block freed into
// quarantine keeps its tokens and is not handed out until it is reclaimed.
#include "daemon/radix/token_store.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace hicache {
namespace {

constexpr uint32_t kPage = 4;

void Fill(TokenStore& store, TokenStore::BlockId block, int32_t value) {
  std::fill_n(store.Data(block), kPage, value);
}

bool Holds(const TokenStore& store, TokenStore::BlockId block, int32_t value) {
  const int32_t* data = store.Data(block);
  return std::all_of(data, data + kPage, [&](int32_t t) { return t == value; });
}

TEST(TokenStoreTest, AFreedBlockIsHandedOutAgain) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  EXPECT_EQ(store.blocks_in_use(), 1);
  store.Free(a);
  EXPECT_EQ(store.blocks_in_use(), 0);
  EXPECT_EQ(store.Allocate(), a);  // Last freed, first reused.
}

TEST(TokenStoreTest, AQuarantinedBlockKeepsItsTokensUntilReclaimed) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  Fill(store, a, 7);
  const int32_t* reader = store.Data(a);  // What a reader reads through.
  store.FreeAfter(a, /*epoch=*/5);
  EXPECT_EQ(store.blocks_in_use(), 0);
  EXPECT_EQ(store.blocks_quarantined(), 1);
  // Every block handed out meanwhile is another one, and writing it leaves
  // the quarantined tokens as they were.
  std::vector<TokenStore::BlockId> others;
  store.AllocateMany(store.blocks_mapped() - 1, &others);
  EXPECT_EQ(std::count(others.begin(), others.end(), a), 0);
  for (TokenStore::BlockId b : others) Fill(store, b, 9);
  EXPECT_TRUE(std::all_of(reader, reader + kPage,
                          [](int32_t t) { return t == 7; }));
  store.Reclaim(4);  // The reader is not past epoch 5 yet.
  EXPECT_EQ(store.blocks_quarantined(), 1);
  store.Reclaim(5);
  EXPECT_EQ(store.blocks_quarantined(), 0);
  EXPECT_EQ(store.Allocate(), a);  // Free again once reclaimed.
}

TEST(TokenStoreTest, ReclaimFreesByEpochInOrder) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  std::vector<TokenStore::BlockId> blocks;
  store.AllocateMany(4, &blocks);
  store.FreeAfter(blocks[0], 1);
  store.FreeAfter(blocks[1], 3);
  store.FreeAfter(blocks[2], 3);
  store.FreeAfter(blocks[3], 8);
  store.Reclaim(3);
  EXPECT_EQ(store.blocks_quarantined(), 1);
  store.Reclaim(100);
  EXPECT_EQ(store.blocks_quarantined(), 0);
  EXPECT_EQ(store.blocks_in_use(), 0);
}

TEST(TokenStoreTest, QuarantinedPointersSurviveGrowth) {
  TokenStore store(kPage, /*reserve_tokens=*/4);
  const TokenStore::BlockId a = store.Allocate();
  Fill(store, a, 5);
  const int32_t* reader = store.Data(a);
  store.FreeAfter(a, 1);
  const int64_t mapped = store.blocks_mapped();
  std::vector<TokenStore::BlockId> more;
  store.AllocateMany(mapped * 3, &more);  // New chunks mapped meanwhile.
  EXPECT_GT(store.blocks_mapped(), mapped);
  for (TokenStore::BlockId b : more) {
    ASSERT_NE(b, a);
    Fill(store, b, 1);
  }
  EXPECT_EQ(reader, store.Data(a));  // Pointers do not move.
  EXPECT_TRUE(Holds(store, a, 5));
}

TEST(TokenStoreTest, PagesSpanAKeyAndCheckItsShape) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  std::vector<TokenStore::BlockId> blocks;
  store.AllocateMany(3, &blocks);
  for (int i = 0; i < 3; ++i) Fill(store, blocks[i], i);
  std::vector<absl::Span<const int32_t>> pages;
  ASSERT_TRUE(store.Pages(blocks, 2 * kPage + 1, &pages));  // Last partial.
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(pages[0].data(), store.Data(blocks[0]));
  EXPECT_EQ(pages[1].size(), kPage);
  EXPECT_EQ(pages[2].size(), 1u);
  EXPECT_EQ(pages[2][0], 2);
  EXPECT_FALSE(store.Pages(blocks, 2 * kPage, &pages));      // A block spare.
  EXPECT_FALSE(store.Pages(blocks, 3 * kPage + 1, &pages));  // Too few.
  EXPECT_TRUE(store.Pages({}, 0, &pages));
  EXPECT_TRUE(pages.empty());
}

TEST(TokenStoreDeathTest, QuarantineEpochsMustNotGoBack) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  const TokenStore::BlockId b = store.Allocate();
  store.FreeAfter(a, 5);
  EXPECT_DEATH(store.FreeAfter(b, 4), "out of epoch order");
}

}  // namespace
}  // namespace hicache
