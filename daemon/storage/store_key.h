#pragma once

// Keys of pages in a storage tier (L3; docs/storage-tier.md §2).
//
// A page's key stands for everything that decides its bytes: the layout
// (geometry, cp_size, page size and model, folded by the engine into one
// 64-bit `layout` fingerprint), the namespace, and every token of the page
// and of the pages before it in its sequence. Keys are chained: the key of
// page i is a hash of the key of page i-1 and page i's tokens, the first
// page's "previous" key being Seed(layout, namespace). So two sequences
// share the key of page i exactly when they share the layout, the namespace
// and pages 0..i, and a store can be shared by any daemons of one layout.
// Engines that address pages by chained hashes (SGLang's storage API) map
// onto the same scheme: a key is a 128-bit chained hash.
//
// The hash is XXH3-128 (libxxhash), deterministic across processes, hosts
// and runs. 128 bits: a store holding 10^9 pages has a collision
// probability around 10^-21, so a key is trusted to name its content; each
// page's bytes carry their own checksum against media faults.

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hicache {

struct StoreKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  bool operator==(const StoreKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const StoreKey& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
  // 32 lowercase hex digits, hi first: the form shared stores use as a name.
  std::string ToHex() const;
};

// The chain of page keys.
class StoreKeyChain {
 public:
  // The key "before" page 0 of every sequence of this layout and namespace.
  static StoreKey Seed(uint64_t layout, absl::string_view ns);
  // The key of a page holding `tokens` after the page keyed `previous`.
  static StoreKey Next(const StoreKey& previous,
                       absl::Span<const int32_t> tokens);
  // Keys of the first `pages` whole pages of `tokens` (page_size tokens
  // each; REQUIRES pages * page_size <= tokens.size()).
  static std::vector<StoreKey> Keys(uint64_t layout, absl::string_view ns,
                                    absl::Span<const int32_t> tokens,
                                    uint32_t page_size, int64_t pages);
};

}  // namespace hicache
