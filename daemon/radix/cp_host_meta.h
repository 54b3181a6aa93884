#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

// Committed (or reserved) host copy of one radix node under CP shared KV.
//
// The node's `logical_len` valid tokens span ceil(logical_len / P) logical
// pages. page_owners[i] is the rank that owns page i (identical on every
// rank); rank r stores exactly the pages it owns, in position order, at the
// host pages host_pages(r). A rank that owns no page has an empty list: it is
// valid and still acknowledges every backup and load (with a no-op).
//
// Owned positions are derived from page_owners, never stored twice:
// OwnedPagePositions(r) = {i : page_owners[i] == r}.
//
// Immutable value type.
class CpHostMeta {
 public:
  // Validates: page_size a power of two; logical_len > 0; page_owners has
  // ceil(logical_len / P) entries, each < cp_size; host_pages has cp_size
  // lists, list r as long as the number of pages rank r owns, every index
  // >= 0. INVALID_ARGUMENT naming the field otherwise.
  static absl::StatusOr<CpHostMeta> Create(
      int64_t logical_len, uint32_t page_size, uint32_t cp_size,
      std::vector<Rank> page_owners,
      std::vector<std::vector<int64_t>> host_pages);

  // The same from per-rank *token* positions (the engine's view): each
  // rank's positions must be sorted, unique, inside [0, logical_len), cover
  // whole pages that rank owns, and the ranks together cover every token.
  static absl::StatusOr<CpHostMeta> FromOwnedTokenPositions(
      int64_t logical_len, uint32_t page_size, uint32_t cp_size,
      std::vector<Rank> page_owners,
      const std::vector<std::vector<int64_t>>& owned_token_positions,
      std::vector<std::vector<int64_t>> host_pages);

  int64_t logical_len() const { return logical_len_; }
  uint32_t page_size() const { return page_size_; }
  uint32_t cp_size() const { return static_cast<uint32_t>(host_pages_.size()); }
  int64_t num_pages() const {
    return static_cast<int64_t>(page_owners_.size());
  }
  const std::vector<Rank>& page_owners() const { return page_owners_; }
  const std::vector<int64_t>& host_pages(Rank rank) const {
    return host_pages_[rank];
  }
  // Host pages over all ranks.
  int64_t total_host_pages() const { return num_pages(); }

  std::vector<int64_t> OwnedPagePositions(Rank rank) const;
  // Token positions of rank's pages, clipped to logical_len.
  std::vector<int64_t> OwnedTokenPositions(Rank rank) const;

  // Splits at token k into [0, k) and [k, logical_len): page_owners are
  // split by page, host pages follow their pages, the child's positions are
  // rebased to 0. INVALID_ARGUMENT unless 0 < k < logical_len and k is a
  // multiple of page_size (a padded tail page is never split). Unlike the
  // seed, which splits at 0 into an empty head, 0 and logical_len are
  // refused: an empty CpHostMeta cannot exist (Create refuses
  // logical_len <= 0), and RadixTree never splits a node at its ends (each
  // of its split sites needs at least one page on either side).
  absl::StatusOr<std::pair<CpHostMeta, CpHostMeta>> Split(int64_t k) const;

  bool operator==(const CpHostMeta&) const = default;

 private:
  CpHostMeta(int64_t logical_len, uint32_t page_size,
             std::vector<Rank> page_owners,
             std::vector<std::vector<int64_t>> host_pages)
      : logical_len_(logical_len),
        page_size_(page_size),
        page_owners_(std::move(page_owners)),
        host_pages_(std::move(host_pages)) {}

  int64_t logical_len_;
  uint32_t page_size_;
  std::vector<Rank> page_owners_;
  std::vector<std::vector<int64_t>> host_pages_;  // [rank][owned page #]
};

}  // namespace hicache
