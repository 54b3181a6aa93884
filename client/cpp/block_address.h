#pragma once

// Byte addresses of KV blocks inside a rank's pools, from the BlockAddress
// lists of GetLayoutResponse (device_blocks, host_blocks). Pages here are
// *physical* pages of the rank's pool (logical page L lives on rank L mod C
// as physical page L div C; docs/cp-layout.md).

#include <cstdint>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::client {

// offset + page * page_stride: where page `page` of `block` starts, from
// byte 0 of its pool. No bounds check; see CheckedBlockOffset.
uint64_t BlockOffset(const v1::BlockAddress& block, int64_t page);

// BlockOffset, after checking that page >= 0 and that the block's
// block_bytes bytes lie inside a pool of `pool_size` bytes (OUT_OF_RANGE
// otherwise, naming the page and the sizes; no overflow on hostile values).
absl::StatusOr<uint64_t> CheckedBlockOffset(const v1::BlockAddress& block,
                                            int64_t page, uint64_t pool_size);

// The entry of `blocks` for (family, layer); NOT_FOUND when there is none.
// The pointer is into `blocks` and lives as long as it does.
absl::StatusOr<const v1::BlockAddress*> FindBlock(
    const google::protobuf::RepeatedPtrField<v1::BlockAddress>& blocks,
    uint32_t family, uint32_t layer);

}  // namespace hicache::client
