// The KV-event block hash as documented (docs/kv-events.md), against values
// computed by an independent XXH3 (Python's xxhash 3.0):
//   seed = xxh3_64(b"tenant", seed=7)
//   h1   = xxh3_64(pack("<2i", 1, -2), seed=seed)
//   h2   = xxh3_64(pack("<2i", 70000, 3), seed=h1)
#include "daemon/radix/block_hashes.h"

#include <vector>

#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(BlockHashesTest, MatchesTheDocumentedDefinition) {
  const uint64_t seed = BlockHashes::Seed("tenant", 7);
  EXPECT_EQ(seed, 5800290486659281738ull);
  std::vector<uint64_t> hashes;
  const std::vector<int32_t> tokens = {1, -2, 70000, 3, 9};  // A partial block.
  EXPECT_EQ(BlockHashes::Chain(seed, tokens, 2, &hashes), 5986492925882532696ull);
  EXPECT_EQ(hashes,
            (std::vector<uint64_t>{11791226594867990447ull, 5986492925882532696ull}));
  EXPECT_EQ(BlockHashes::Next(seed, {1, -2}), 11791226594867990447ull);
  // Another namespace or seed: other hashes for the same tokens.
  EXPECT_NE(BlockHashes::Seed("tenant", 8), seed);
  EXPECT_NE(BlockHashes::Seed("tenant-b", 7), seed);
}

}  // namespace
}  // namespace hicache
