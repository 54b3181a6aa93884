#include "daemon/radix/token_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>

#include "daemon/core/check.h"

namespace hicache {

namespace {
constexpr size_t kChunkBytes = size_t{1} << 20;
// The chunk table is reserved whole, so that its entries never move (a
// reader on another thread calls Data()): 512 KiB of address space, touched
// only as chunks are added.
constexpr size_t kMaxChunks = size_t{1} << 16;
}  // namespace

TokenStore::TokenStore(uint32_t page_size, int64_t reserve_tokens)
    : page_size_(page_size),
      blocks_per_chunk_(static_cast<uint32_t>(
          std::max<size_t>(1, kChunkBytes / (sizeof(int32_t) * page_size)))) {
  chunks_.reserve(kMaxChunks);
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
  HICACHE_CHECK(chunks_.size() < kMaxChunks,
                "token store past its chunk table (64 GiB of token ids)");
  chunks_.push_back(static_cast<int32_t*>(memory));  // Never reallocates.
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

bool TokenStore::Pages(absl::Span<const BlockId> blocks, int64_t len,
                       std::vector<absl::Span<const int32_t>>* out) const {
  out->clear();
  out->reserve(blocks.size());
  int64_t left = len;
  for (BlockId block : blocks) {
    if (left <= 0) return false;
    const int64_t n = std::min<int64_t>(page_size_, left);
    out->emplace_back(Data(block), static_cast<size_t>(n));
    left -= n;
  }
  return left == 0;
}

void TokenStore::Free(BlockId block) {
  free_.push_back(block);
  --in_use_;
}

void TokenStore::FreeAfter(BlockId block, uint64_t epoch) {
  HICACHE_CHECK(quarantine_.empty() || quarantine_.back().first <= epoch,
                "token blocks quarantined out of epoch order");
  quarantine_.emplace_back(epoch, block);
  --in_use_;
}

void TokenStore::Reclaim(uint64_t through) {
  while (!quarantine_.empty() && quarantine_.front().first <= through) {
    free_.push_back(quarantine_.front().second);
    quarantine_.pop_front();
  }
}

}  // namespace hicache
