#pragma once

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hicache {

// Content keys of the pages of one token sequence in one namespace: key(i)
// stands for the namespace and every token of pages 0..i (the last page may
// be partial), so two sequences share key(i) exactly when they share that
// prefix (up to 64-bit hash collisions). Chained, so each key costs one page
// of hashing (XXH3), computed on first use. Deterministic across processes
// and runs: the frequency sketch fed with these keys gives reproducible
// eviction orders.
//
// Holds a view of `tokens`: the caller keeps them alive.
class PageKeys {
 public:
  PageKeys(absl::string_view ns, absl::Span<const int32_t> tokens,
           uint32_t page_size);

  // Pages in the sequence: ceil(tokens / page_size).
  int64_t size() const { return pages_; }
  // The key of page `page` (0 <= page < size()).
  uint64_t At(int64_t page);
  // The key of a page with these tokens after a page keyed `previous`.
  static uint64_t Next(uint64_t previous, absl::Span<const int32_t> page);

 private:
  absl::Span<const int32_t> tokens_;
  uint32_t page_size_;
  int64_t pages_;
  uint64_t seed_;               // Key "before" page 0: the namespace.
  std::vector<uint64_t> keys_;  // Computed so far.
};

}  // namespace hicache
