// PageKeys: chained content keys of a token sequence's pages (the frequency
// sketch's keys under the tinylfu policy). P = 4 throughout.
#include "daemon/radix/page_keys.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/tokens.h"
#include "xxhash.h"

namespace hicache {
namespace {

using testing::Seq;

constexpr uint32_t kP = 4;

std::vector<int32_t> Cat(std::vector<int32_t> a,
                         const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Every key of the sequence, computed in order.
std::vector<uint64_t> AllKeys(const std::string& ns,
                              const std::vector<int32_t>& tokens) {
  PageKeys keys(ns, tokens, kP);
  std::vector<uint64_t> out;
  for (int64_t i = 0; i < keys.size(); ++i) out.push_back(keys.At(i));
  return out;
}

TEST(PageKeysTest, SizeIsTheNumberOfPagesRoundedUp) {
  const std::vector<int32_t> tokens = Seq(0, 17);
  absl::Span<const int32_t> all(tokens);
  EXPECT_EQ(PageKeys("", all.subspan(0, 0), kP).size(), 0);
  EXPECT_EQ(PageKeys("", all.subspan(0, 1), kP).size(), 1);
  EXPECT_EQ(PageKeys("", all.subspan(0, 4), kP).size(), 1);
  EXPECT_EQ(PageKeys("", all.subspan(0, 5), kP).size(), 2);
  EXPECT_EQ(PageKeys("", all.subspan(0, 16), kP).size(), 4);
  EXPECT_EQ(PageKeys("", all, kP).size(), 5);
  EXPECT_EQ(PageKeys("ns", all, 64).size(), 1);
}

TEST(PageKeysTest, SameTokensAndNamespaceGiveTheSameKeys) {
  const std::vector<int32_t> a = Seq(0, 14);
  const std::vector<int32_t> copy = a;  // Another buffer, same content.
  const std::vector<uint64_t> keys = AllKeys("tenant", a);
  ASSERT_EQ(keys.size(), 4u);
  EXPECT_EQ(AllKeys("tenant", copy), keys);
  // Every page's key is distinct (chained: each stands for its prefix).
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = i + 1; j < keys.size(); ++j) {
      EXPECT_NE(keys[i], keys[j]) << i << " vs " << j;
    }
  }
}

TEST(PageKeysTest, DifferentNamespacesGiveDifferentKeys) {
  const std::vector<int32_t> a = Seq(0, 16);
  const std::vector<uint64_t> empty_ns = AllKeys("", a);
  const std::vector<uint64_t> tenant_a = AllKeys("a", a);
  const std::vector<uint64_t> tenant_b = AllKeys("b", a);
  ASSERT_EQ(empty_ns.size(), 4u);
  for (size_t i = 0; i < empty_ns.size(); ++i) {
    EXPECT_NE(empty_ns[i], tenant_a[i]) << "page " << i;
    EXPECT_NE(tenant_a[i], tenant_b[i]) << "page " << i;
    EXPECT_NE(empty_ns[i], tenant_b[i]) << "page " << i;
  }
}

// Keys are equal exactly up to the page where the sequences diverge, and
// differ from there on even where later pages hold the same tokens again.
TEST(PageKeysTest, SharedPrefixSharesKeysUpToTheDivergencePage) {
  const std::vector<int32_t> a = Seq(0, 20);
  // Diverges at token 9 (page 2), then has a's page 3 and 4 tokens again.
  std::vector<int32_t> b = a;
  b[9] = 500;
  const std::vector<uint64_t> ka = AllKeys("", a);
  const std::vector<uint64_t> kb = AllKeys("", b);
  ASSERT_EQ(ka.size(), 5u);
  ASSERT_EQ(kb.size(), 5u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  EXPECT_NE(ka[2], kb[2]);
  EXPECT_NE(ka[3], kb[3]);  // Same tokens 12..15, different prefix.
  EXPECT_NE(ka[4], kb[4]);

  // Divergence exactly at a page boundary (token 8).
  const std::vector<int32_t> c = Cat(Seq(0, 8), Seq(700, 8));
  const std::vector<uint64_t> kc = AllKeys("", c);
  EXPECT_EQ(ka[0], kc[0]);
  EXPECT_EQ(ka[1], kc[1]);
  EXPECT_NE(ka[2], kc[2]);
  EXPECT_NE(ka[3], kc[3]);

  // A shorter sequence that is a prefix of `a` has a's keys.
  const std::vector<uint64_t> prefix = AllKeys("", Seq(0, 12));
  ASSERT_EQ(prefix.size(), 3u);
  EXPECT_EQ(prefix, std::vector<uint64_t>(ka.begin(), ka.begin() + 3));
}

// A partial last page is keyed by its own tokens: not by the full page it
// would be part of in a longer sequence, not by a zero-padded page.
TEST(PageKeysTest, PartialLastPageIsKeyedByItsTokens) {
  const std::vector<int32_t> partial = Seq(0, 10);  // Page 2 = {8, 9}.
  const std::vector<uint64_t> kp = AllKeys("", partial);
  ASSERT_EQ(kp.size(), 3u);
  EXPECT_EQ(AllKeys("", Seq(0, 10)), kp);
  const std::vector<uint64_t> full = AllKeys("", Seq(0, 12));
  EXPECT_EQ(kp[0], full[0]);
  EXPECT_EQ(kp[1], full[1]);
  EXPECT_NE(kp[2], full[2]);
  const std::vector<uint64_t> padded = AllKeys("", Cat(Seq(0, 10), {0, 0}));
  EXPECT_EQ(kp[1], padded[1]);
  EXPECT_NE(kp[2], padded[2]);
  const std::vector<uint64_t> other_tail = AllKeys("", Cat(Seq(0, 9), {42}));
  EXPECT_NE(kp[2], other_tail[2]);
  const std::vector<uint64_t> shorter = AllKeys("", Seq(0, 9));  // {8}.
  EXPECT_NE(kp[2], shorter[2]);
}

// The documented construction (XXH3 chained from the namespace's hash):
// keys are reproducible across processes and runs.
TEST(PageKeysTest, KeysAreTheDocumentedXxh3Chain) {
  const std::string ns = "tenant-7";
  const std::vector<int32_t> tokens = Seq(1000, 10);
  uint64_t previous = XXH3_64bits(ns.data(), ns.size());
  std::vector<uint64_t> expected;
  for (size_t from = 0; from < tokens.size(); from += kP) {
    const size_t count = std::min<size_t>(kP, tokens.size() - from);
    previous = XXH3_64bits_withSeed(tokens.data() + from,
                                    sizeof(int32_t) * count, previous);
    expected.push_back(previous);
  }
  EXPECT_EQ(AllKeys(ns, tokens), expected);
}

// At() computes lazily and caches; asking out of order gives the same keys
// as asking in order, and asking again gives the same key.
TEST(PageKeysTest, LazyAtIsOrderIndependent) {
  const std::vector<int32_t> tokens = Seq(3, 27);  // 7 pages, last partial.
  const std::vector<uint64_t> sequential = AllKeys("x", tokens);
  ASSERT_EQ(sequential.size(), 7u);

  PageKeys keys("x", tokens, kP);
  EXPECT_EQ(keys.At(5), sequential[5]);
  EXPECT_EQ(keys.At(2), sequential[2]);
  EXPECT_EQ(keys.At(6), sequential[6]);
  EXPECT_EQ(keys.At(0), sequential[0]);
  EXPECT_EQ(keys.At(5), sequential[5]);
  EXPECT_EQ(keys.size(), 7);

  PageKeys backwards("x", tokens, kP);
  for (int64_t i = backwards.size() - 1; i >= 0; --i) {
    EXPECT_EQ(backwards.At(i), sequential[i]) << "page " << i;
  }
}

}  // namespace
}  // namespace hicache
