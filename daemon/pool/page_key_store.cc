#include "daemon/pool/page_key_store.h"

#include <sys/mman.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/pool/persistent_host_segment.h"

namespace hicache {
namespace {

constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14.
#endif

// Faults the segment's pages in now, keeping their bytes, so that writing a
// slot later (under the engine's lock) never waits for the kernel to
// allocate and clear a page. Best effort: an older kernel just faults them
// in on first use.
void Populate(void* data, uint64_t size) {
  if (size == 0) return;
  (void)madvise(data, size, MADV_POPULATE_WRITE);
}

}  // namespace

absl::Status PageKeyStore::CheckShape(Rank num_ranks, int64_t pages_per_rank,
                                      uint32_t page_size, uint64_t* bytes) {
  if (num_ranks < 1 || pages_per_rank < 1 || page_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page key store: ", num_ranks, " ranks, ", pages_per_rank,
        " pages a rank, page size ", page_size, " (each must be at least 1)"));
  }
  const uint64_t slot_bytes = uint64_t{page_size} * sizeof(int32_t);
  if (static_cast<uint64_t>(pages_per_rank) > kMaxSegmentBytes / slot_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("page key store: ", pages_per_rank, " pages of ",
                     page_size, " tokens exceed 2^40 bytes a rank"));
  }
  *bytes = slot_bytes * static_cast<uint64_t>(pages_per_rank);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PageKeyStore>> PageKeyStore::Open(
    const Options& options) {
  uint64_t size = 0;
  if (absl::Status s = CheckShape(options.num_ranks, options.pages_per_rank,
                                  options.page_size, &size);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<PageKeyStore> store(
      new PageKeyStore(options.page_size, options.pages_per_rank));
  bool all_attached = true;
  for (Rank r = 0; r < options.num_ranks; ++r) {
    absl::StatusOr<PersistentHostSegment> segment = OpenPersistentSegment(
        options.prefix, "keys", r, size, /*lock_memory=*/false,
        options.fingerprint);
    if (!segment.ok()) return segment.status();
    all_attached = all_attached && segment->attached;
    for (std::string& name : segment->removed) {
      store->removed_.push_back(std::move(name));
    }
    Populate(segment->pool->host_data(), size);
    store->slots_.push_back(static_cast<int32_t*>(segment->pool->host_data()));
    store->segments_.push_back(std::move(segment->pool));
  }
  store->attached_ = all_attached;
  return store;
}

absl::StatusOr<std::unique_ptr<PageKeyStore>> PageKeyStore::InMemory(
    Rank num_ranks, int64_t pages_per_rank, uint32_t page_size) {
  uint64_t size = 0;
  if (absl::Status s = CheckShape(num_ranks, pages_per_rank, page_size, &size);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<PageKeyStore> store(
      new PageKeyStore(page_size, pages_per_rank));
  for (Rank r = 0; r < num_ranks; ++r) {
    store->memory_.emplace_back(size / sizeof(int32_t), 0);
    store->slots_.push_back(store->memory_.back().data());
  }
  return store;
}

absl::Status PageKeyStore::Check(Rank rank, int64_t page, size_t count) const {
  if (rank >= slots_.size() || page < 0 || page >= pages_per_rank_ ||
      count > page_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page key store: rank ", rank, " page ", page, " with ", count,
        " tokens is outside ", slots_.size(), " ranks of ", pages_per_rank_,
        " pages of ", page_size_, " tokens"));
  }
  return absl::OkStatus();
}

int32_t* PageKeyStore::Slot(Rank rank, int64_t page) const {
  return slots_[rank] + static_cast<uint64_t>(page) * page_size_;
}

absl::Status PageKeyStore::Write(Rank rank, int64_t page,
                                 absl::Span<const int32_t> tokens) {
  if (absl::Status s = Check(rank, page, tokens.size()); !s.ok()) return s;
  if (!tokens.empty()) {
    std::memcpy(Slot(rank, page), tokens.data(),
                tokens.size() * sizeof(int32_t));
  }
  return absl::OkStatus();
}

absl::Status PageKeyStore::WriteNode(
    absl::Span<const uint32_t> owners,
    absl::Span<const std::vector<int64_t>> pages,
    absl::Span<const absl::Span<const int32_t>> key_pages) {
  if (key_pages.size() != owners.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page key store: ", key_pages.size(), " key pages for ",
                     owners.size(), " page owners"));
  }
  const size_t ranks = std::min(pages.size(), slots_.size());
  // Pages taken so far, by rank (a node spans few ranks: no allocation up
  // to 16).
  absl::InlinedVector<size_t, 16> next(ranks, 0);
  for (size_t i = 0; i < owners.size(); ++i) {
    const uint32_t rank = owners[i];
    if (rank >= ranks || next[rank] >= pages[rank].size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page key store: key page ", i, " is owned by rank ", rank,
          ", which has no page left for it"));
    }
    const int64_t page = pages[rank][next[rank]++];
    if (absl::Status s = Check(rank, page, key_pages[i].size()); !s.ok()) {
      return s;
    }
  }
  std::fill(next.begin(), next.end(), 0);
  for (size_t i = 0; i < owners.size(); ++i) {
    const uint32_t rank = owners[i];
    const int64_t page = pages[rank][next[rank]++];
    const absl::Span<const int32_t> tokens = key_pages[i];
    if (tokens.empty()) continue;
    std::memcpy(Slot(rank, page), tokens.data(),
                tokens.size() * sizeof(int32_t));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const int32_t>> PageKeyStore::Read(
    Rank rank, int64_t page, size_t count) const {
  if (absl::Status s = Check(rank, page, count); !s.ok()) return s;
  return absl::Span<const int32_t>(Slot(rank, page), count);
}

uint64_t PageTokensChecksum(absl::Span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t));
}

}  // namespace hicache
