#pragma once

#include <cstdint>
#include <deque>
#include <utility>
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
// Quarantine: a reader on another thread (the host-tier recorder, which
// copies a committed node's key later, off the engine's lock) may still read
// a block its owner frees. FreeAfter(block, epoch) keeps such a block out of
// circulation, its tokens unchanged, until Reclaim(through) with
// through >= epoch says that no reader reads it any more. Data()'s pointers
// stay valid for the store's lifetime and the chunk table never moves, so a
// reader may call Data() for a block it was handed under its owner's
// serialization, and read it without that serialization.
//
// Thread-compatible otherwise: every other call runs under its owner's
// serialization.
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
  // Frees `block` into quarantine: handed out again only after a
  // Reclaim(through >= epoch). Epochs must not decrease from one call to the
  // next.
  void FreeAfter(BlockId block, uint64_t epoch);
  // Frees every quarantined block whose epoch is at most `through`.
  void Reclaim(uint64_t through);

  int32_t* Data(BlockId block) {
    return chunks_[block / blocks_per_chunk_] +
           static_cast<size_t>(block % blocks_per_chunk_) * page_size_;
  }
  const int32_t* Data(BlockId block) const {
    return const_cast<TokenStore*>(this)->Data(block);
  }
  // The `len` tokens of a key kept in `blocks`, one span a block into the
  // store (page_size tokens each, the last what is left of `len`), in *out
  // (cleared first). False, *out partly filled, if the blocks do not hold
  // exactly `len` tokens (too few, or a block past the last token). Like
  // Data(), callable from a reader's thread for blocks it was handed.
  bool Pages(absl::Span<const BlockId> blocks, int64_t len,
             std::vector<absl::Span<const int32_t>>* out) const;

  uint32_t page_size() const { return page_size_; }
  // Allocated and not freed (quarantined blocks are not counted).
  int64_t blocks_in_use() const { return in_use_; }
  // Freed into quarantine and not reclaimed yet.
  int64_t blocks_quarantined() const {
    return static_cast<int64_t>(quarantine_.size());
  }
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
  // (epoch, block), epochs non-decreasing.
  std::deque<std::pair<uint64_t, BlockId>> quarantine_;
};

}  // namespace hicache
