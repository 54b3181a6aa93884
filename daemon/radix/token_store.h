#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace hicache {

// Storage for radix keys in fixed-size blocks of `page_size` token ids, the
// same granularity as KV pages: node keys start at page boundaries, so a key
// is a list of block ids, a split at a page boundary moves ids without
// copying tokens, and freeing a node returns whole blocks.
//
// Blocks live in 1 MiB-class chunks mapped in bulk. `reserve_tokens` maps
// (and pre-faults) enough chunks up front, so inserts on the serving path do
// not pay first-touch page faults; the daemon sizes it from its pool capacity.
// Memory: 4 bytes per token plus 4 bytes per block id.
//
// Thread-compatible.
class TokenStore {
 public:
  using BlockId = uint32_t;

  TokenStore(uint32_t page_size, int64_t reserve_tokens);
  ~TokenStore();
  TokenStore(const TokenStore&) = delete;
  TokenStore& operator=(const TokenStore&) = delete;

  BlockId Allocate();
  // Appends `n` blocks to `out`.
  void AllocateMany(int64_t n, std::vector<BlockId>* out);
  void Free(BlockId block);

  int32_t* Data(BlockId block) {
    return chunks_[block / blocks_per_chunk_] +
           static_cast<size_t>(block % blocks_per_chunk_) * page_size_;
  }
  const int32_t* Data(BlockId block) const {
    return const_cast<TokenStore*>(this)->Data(block);
  }

  uint32_t page_size() const { return page_size_; }
  int64_t blocks_in_use() const { return in_use_; }
  int64_t blocks_mapped() const {
    return static_cast<int64_t>(chunks_.size()) * blocks_per_chunk_;
  }

 private:
  void AddChunk(bool prefault);

  const uint32_t page_size_;
  const uint32_t blocks_per_chunk_;
  std::vector<int32_t*> chunks_;
  std::vector<BlockId> free_;
  int64_t in_use_ = 0;
};

}  // namespace hicache
