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
// Holds: a reader on another thread (the host-tier recorder, which copies a
// committed node's key later, off the engine's lock) holds the blocks it
// will read. A held block keeps its tokens and is not handed out again until
// every hold on it is released, even if it is freed meanwhile (Free then only
// marks it). Data()'s pointers stay valid for the store's lifetime, so a
// holder may read through a pointer taken under the owner's serialization
// without calling into the store.
//
// Thread-compatible: every method runs under its owner's serialization.
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
  // Frees `block`; a held one is handed out again once its last hold goes.
  void Free(BlockId block);

  // One more hold on each block (a block may appear more than once).
  // Every block must be allocated (not freed).
  void Hold(absl::Span<const BlockId> blocks);
  // Releases one hold per entry; a freed block whose last hold goes is free
  // again. Every entry must be held.
  void Release(absl::Span<const BlockId> blocks);

  int32_t* Data(BlockId block) {
    return chunks_[block / blocks_per_chunk_] +
           static_cast<size_t>(block % blocks_per_chunk_) * page_size_;
  }
  const int32_t* Data(BlockId block) const {
    return const_cast<TokenStore*>(this)->Data(block);
  }

  uint32_t page_size() const { return page_size_; }
  // Allocated and not freed (held blocks that were freed are not counted).
  int64_t blocks_in_use() const { return in_use_; }
  // Freed while held: not handed out again until released.
  int64_t blocks_freed_held() const { return freed_held_; }
  // Blocks with at least one hold.
  int64_t blocks_held() const { return held_; }
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
  // Per block: its holds, and kFreedWhileHeld once freed while held. Sized on
  // the first Hold (empty for a store that is never held).
  static constexpr uint32_t kFreedWhileHeld = uint32_t{1} << 31;
  std::vector<uint32_t> holds_;
  int64_t held_ = 0;
  int64_t freed_held_ = 0;
};

}  // namespace hicache
