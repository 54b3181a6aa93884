// Block byte addresses from GetLayoutResponse.BlockAddress: the offset
// formula, bounds checks that hostile values cannot overflow, and lookup.
#include "client/cpp/block_address.h"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache::client {
namespace {

using ::testing::HasSubstr;

v1::BlockAddress Block(uint32_t family, uint32_t layer, uint64_t offset,
                       uint64_t stride, uint64_t bytes) {
  v1::BlockAddress block;
  block.set_family(family);
  block.set_layer(layer);
  block.set_offset(offset);
  block.set_page_stride(stride);
  block.set_block_bytes(bytes);
  return block;
}

TEST(BlockAddressTest, OffsetIsOffsetPlusPageTimesStride) {
  const v1::BlockAddress block = Block(0, 1, 4096, 256, 128);
  EXPECT_EQ(BlockOffset(block, 0), 4096u);
  EXPECT_EQ(BlockOffset(block, 7), 4096u + 7 * 256);
}

TEST(BlockAddressTest, CheckedOffsetKeepsTheBlockInsideThePool) {
  // Pool of 8 pages x 256 bytes after a 4096-byte prefix.
  const uint64_t pool = 4096 + 8 * 256;
  const v1::BlockAddress block = Block(0, 1, 4096, 256, 256);
  EXPECT_EQ(*CheckedBlockOffset(block, 0, pool), 4096u);
  EXPECT_EQ(*CheckedBlockOffset(block, 7, pool), 4096u + 7 * 256);
  auto past = CheckedBlockOffset(block, 8, pool);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(past.status().message()),
              HasSubstr("page 8 of block (family 0, layer 1)"));
  EXPECT_EQ(CheckedBlockOffset(block, -1, pool).status().code(),
            absl::StatusCode::kOutOfRange);
  // Page-first host layout: a stride larger than the block.
  const v1::BlockAddress page_first = Block(0, 1, 128, 512, 128);
  EXPECT_EQ(*CheckedBlockOffset(page_first, 3, 4 * 512), 128u + 3 * 512);
  EXPECT_FALSE(CheckedBlockOffset(page_first, 4, 4 * 512).ok());
}

TEST(BlockAddressTest, HostileValuesDoNotOverflow) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint64_t pool = 1 << 20;
  EXPECT_FALSE(CheckedBlockOffset(Block(0, 0, kMax, 1, 1), 0, pool).ok());
  EXPECT_FALSE(CheckedBlockOffset(Block(0, 0, 0, 1, kMax), 0, pool).ok());
  EXPECT_FALSE(CheckedBlockOffset(Block(0, 0, 0, kMax, 1), 2, pool).ok());
  EXPECT_FALSE(CheckedBlockOffset(Block(0, 0, 16, 1 << 10, 1),
                                  std::numeric_limits<int64_t>::max(), pool)
                   .ok());
  // Stride 0 (a single-page pool): every page is the same bytes.
  EXPECT_EQ(*CheckedBlockOffset(Block(0, 0, 16, 0, 16), 5, 32), 16u);
}

TEST(BlockAddressTest, FindBlockByFamilyAndLayer) {
  google::protobuf::RepeatedPtrField<v1::BlockAddress> blocks;
  *blocks.Add() = Block(0, 0, 0, 64, 64);
  *blocks.Add() = Block(0, 1, 512, 64, 64);
  *blocks.Add() = Block(1, 0, 1024, 32, 32);
  EXPECT_EQ((*FindBlock(blocks, 0, 1))->offset(), 512u);
  EXPECT_EQ((*FindBlock(blocks, 1, 0))->offset(), 1024u);
  auto missing = FindBlock(blocks, 1, 1);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("family 1, layer 1"));
}

}  // namespace
}  // namespace hicache::client
