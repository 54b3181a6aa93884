#include "client/cpp/block_address.h"

#include "absl/strings/str_cat.h"

namespace hicache::client {

uint64_t BlockOffset(const v1::BlockAddress& block, int64_t page) {
  return block.offset() + static_cast<uint64_t>(page) * block.page_stride();
}

absl::StatusOr<uint64_t> CheckedBlockOffset(const v1::BlockAddress& block,
                                            int64_t page, uint64_t pool_size) {
  const auto out_of_range = [&] {
    return absl::OutOfRangeError(absl::StrCat(
        "page ", page, " of block (family ", block.family(), ", layer ",
        block.layer(), "): offset ", block.offset(), " + page * stride ",
        block.page_stride(), " + ", block.block_bytes(),
        " bytes is not inside the pool of ", pool_size, " bytes"));
  };
  if (page < 0) return out_of_range();
  const uint64_t p = static_cast<uint64_t>(page);
  if (block.block_bytes() > pool_size || block.offset() > pool_size) {
    return out_of_range();
  }
  const uint64_t room = pool_size - block.block_bytes();  // Last valid start.
  if (block.offset() > room) return out_of_range();
  if (block.page_stride() != 0 &&
      p > (room - block.offset()) / block.page_stride()) {
    return out_of_range();
  }
  return BlockOffset(block, page);
}

absl::StatusOr<const v1::BlockAddress*> FindBlock(
    const google::protobuf::RepeatedPtrField<v1::BlockAddress>& blocks,
    uint32_t family, uint32_t layer) {
  for (const v1::BlockAddress& block : blocks) {
    if (block.family() == family && block.layer() == layer) return &block;
  }
  return absl::NotFoundError(absl::StrCat("the layout has no block for family ",
                                          family, ", layer ", layer));
}

}  // namespace hicache::client
