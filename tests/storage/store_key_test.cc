#include "daemon/storage/store_key.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

std::vector<int32_t> Tokens(int n, int32_t first) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = first + i;
  return t;
}

TEST(StoreKeyTest, KeysAreDeterministicAndNamePrefixes) {
  const std::vector<int32_t> a = Tokens(64, 1);
  std::vector<int32_t> b = a;
  b[40] = 999;  // Diverges in page 2 (of 16-token pages).
  const std::vector<StoreKey> ka = StoreKeyChain::Keys(7, "ns", a, 16, 4);
  const std::vector<StoreKey> kb = StoreKeyChain::Keys(7, "ns", b, 16, 4);
  EXPECT_EQ(ka, StoreKeyChain::Keys(7, "ns", a, 16, 4));
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);
  EXPECT_NE(ka[3], kb[3]);  // Chained: everything after a divergence differs.
}

TEST(StoreKeyTest, LayoutAndNamespaceAreInEveryKey) {
  const std::vector<int32_t> a = Tokens(32, 5);
  const auto base = StoreKeyChain::Keys(7, "ns", a, 16, 2);
  EXPECT_NE(base, StoreKeyChain::Keys(8, "ns", a, 16, 2));
  EXPECT_NE(base, StoreKeyChain::Keys(7, "other", a, 16, 2));
  // A namespace is length-prefixed: "ab" + layout is not "a" + other bytes.
  EXPECT_NE(StoreKeyChain::Seed(7, "ab"), StoreKeyChain::Seed(7, "a"));
  EXPECT_NE(StoreKeyChain::Seed(7, ""), StoreKeyChain::Seed(8, ""));
}

TEST(StoreKeyTest, PageBoundariesMatter) {
  // The same tokens cut into pages differently give different keys.
  const std::vector<int32_t> a = Tokens(32, 1);
  const StoreKey one = StoreKeyChain::Keys(1, "n", a, 32, 1)[0];
  const StoreKey two = StoreKeyChain::Keys(1, "n", a, 16, 2)[1];
  EXPECT_NE(one, two);
}

TEST(StoreKeyTest, NoCollisionsAmongManyKeys) {
  absl::flat_hash_set<StoreKey> seen;
  StoreKey key = StoreKeyChain::Seed(1, "n");
  for (int32_t i = 0; i < 100000; ++i) {
    const int32_t page[2] = {i, i & 7};
    key = StoreKeyChain::Next(key, page);
    ASSERT_TRUE(seen.insert(key).second) << i;
  }
}

TEST(StoreKeyTest, HexIsThirtyTwoDigitsHighFirst) {
  const StoreKey k{0x0123456789abcdefULL, 0xfULL};
  EXPECT_EQ(k.ToHex(), "0123456789abcdef000000000000000f");
}

}  // namespace
}  // namespace hicache
