#include "daemon/radix/token_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "daemon/core/check.h"

namespace hicache {

namespace {
constexpr size_t kChunkBytes = size_t{1} << 20;
}  // namespace

TokenStore::TokenStore(uint32_t page_size, int64_t reserve_tokens)
    : page_size_(page_size),
      blocks_per_chunk_(static_cast<uint32_t>(
          std::max<size_t>(1, kChunkBytes / (sizeof(int32_t) * page_size)))) {
  const int64_t blocks = (reserve_tokens + page_size - 1) / page_size;
  while (blocks_mapped() < blocks) AddChunk(/*prefault=*/true);
}

TokenStore::~TokenStore() {
  for (int32_t* chunk : chunks_) {
    munmap(chunk, sizeof(int32_t) * page_size_ * blocks_per_chunk_);
  }
}

void TokenStore::AddChunk(bool prefault) {
  const size_t bytes = sizeof(int32_t) * page_size_ * blocks_per_chunk_;
  void* memory =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | (prefault ? MAP_POPULATE : 0), -1, 0);
  if (memory == MAP_FAILED) std::abort();  // Out of memory: nothing to save.
  const BlockId first = static_cast<BlockId>(blocks_mapped());
  chunks_.push_back(static_cast<int32_t*>(memory));
  if (!holds_.empty()) holds_.resize(blocks_mapped(), 0);
  // Hand out low ids first: push in reverse.
  for (BlockId b = first + blocks_per_chunk_; b > first; --b) {
    free_.push_back(b - 1);
  }
}

TokenStore::BlockId TokenStore::Allocate() {
  if (free_.empty()) AddChunk(/*prefault=*/false);
  const BlockId block = free_.back();
  free_.pop_back();
  ++in_use_;
  return block;
}

void TokenStore::AllocateMany(int64_t n, std::vector<BlockId>* out) {
  while (static_cast<int64_t>(free_.size()) < n) AddChunk(/*prefault=*/false);
  out->insert(out->end(), free_.rbegin(), free_.rbegin() + n);
  free_.resize(free_.size() - n);
  in_use_ += n;
}

void TokenStore::Free(BlockId block) {
  --in_use_;
  if (!holds_.empty() && holds_[block] != 0) {
    HICACHE_CHECK((holds_[block] & kFreedWhileHeld) == 0,
                  "a held token block freed twice");
    holds_[block] |= kFreedWhileHeld;
    ++freed_held_;
    return;
  }
  free_.push_back(block);
}

void TokenStore::Hold(absl::Span<const BlockId> blocks) {
  if (holds_.empty()) holds_.assign(blocks_mapped(), 0);
  for (BlockId block : blocks) {
    uint32_t& holds = holds_[block];
    HICACHE_CHECK((holds & kFreedWhileHeld) == 0 &&
                      (holds & ~kFreedWhileHeld) < kFreedWhileHeld - 1,
                  "a token block held after it was freed, or too often");
    if (holds++ == 0) ++held_;
  }
}

void TokenStore::Release(absl::Span<const BlockId> blocks) {
  for (BlockId block : blocks) {
    HICACHE_CHECK(block < holds_.size() &&
                      (holds_[block] & ~kFreedWhileHeld) != 0,
                  "a token block released but not held");
    uint32_t& holds = holds_[block];
    if (--holds != kFreedWhileHeld) {
      if (holds == 0) --held_;
      continue;
    }
    holds = 0;
    --held_;
    --freed_held_;
    free_.push_back(block);
  }
}

}  // namespace hicache
