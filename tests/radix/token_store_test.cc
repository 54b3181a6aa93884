// TokenStore: blocks handed out, freed and reused; holds keep a freed
// block's tokens and keep it from being handed out until the last release.
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

TEST(TokenStoreTest, AHeldBlockFreedKeepsItsTokensUntilReleased) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  Fill(store, a, 7);
  const int32_t* reader = store.Data(a);  // What a holder reads through.
  store.Hold({a});
  EXPECT_EQ(store.blocks_held(), 1);
  store.Free(a);
  EXPECT_EQ(store.blocks_in_use(), 0);
  EXPECT_EQ(store.blocks_freed_held(), 1);
  // Every block handed out meanwhile is another one, and writing it leaves
  // the held tokens as they were.
  std::vector<TokenStore::BlockId> others;
  store.AllocateMany(store.blocks_mapped() - 1, &others);
  EXPECT_EQ(std::count(others.begin(), others.end(), a), 0);
  for (TokenStore::BlockId b : others) Fill(store, b, 9);
  EXPECT_TRUE(std::all_of(reader, reader + kPage,
                          [](int32_t t) { return t == 7; }));
  store.Release({a});
  EXPECT_EQ(store.blocks_held(), 0);
  EXPECT_EQ(store.blocks_freed_held(), 0);
  EXPECT_EQ(store.Allocate(), a);  // Free again once released.
}

TEST(TokenStoreTest, EveryHoldMustBeReleased) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  Fill(store, a, 3);
  store.Hold({a, a});  // Held twice (two commits of one node).
  store.Hold({a});
  store.Free(a);
  store.Release({a, a});
  EXPECT_EQ(store.blocks_freed_held(), 1);  // One hold left.
  const TokenStore::BlockId b = store.Allocate();
  EXPECT_NE(b, a);
  EXPECT_TRUE(Holds(store, a, 3));
  store.Release({a});
  EXPECT_EQ(store.blocks_freed_held(), 0);
  EXPECT_EQ(store.Allocate(), a);
}

TEST(TokenStoreTest, AHeldBlockNotFreedStaysItsOwners) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  store.Hold({a});
  store.Release({a});  // Released while still allocated: nothing freed.
  EXPECT_EQ(store.blocks_in_use(), 1);
  EXPECT_EQ(store.blocks_held(), 0);
  EXPECT_NE(store.Allocate(), a);
  store.Free(a);
  EXPECT_EQ(store.Allocate(), a);
}

TEST(TokenStoreTest, HoldsSurviveGrowth) {
  TokenStore store(kPage, /*reserve_tokens=*/4);
  const TokenStore::BlockId a = store.Allocate();
  Fill(store, a, 5);
  const int32_t* reader = store.Data(a);
  store.Hold({a});
  store.Free(a);
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
  store.Hold({more.back()});  // Blocks of new chunks can be held too.
  store.Release({a, more.back()});
  EXPECT_EQ(store.blocks_held(), 0);
}

TEST(TokenStoreDeathTest, ReleasingWhatIsNotHeldIsABug) {
  TokenStore store(kPage, /*reserve_tokens=*/64);
  const TokenStore::BlockId a = store.Allocate();
  EXPECT_DEATH(store.Release({a}), "released but not held");
}

}  // namespace
}  // namespace hicache
