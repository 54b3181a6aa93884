#pragma once

// The block hashes of KV events (docs/kv-events.md, "Block hashes"): a stable,
// documented 64-bit hash that routers may recompute.
//
//   seed(ns)        = XXH3_64bits_withSeed(ns's UTF-8 bytes, hash_seed)
//   hash(block i)   = XXH3_64bits_withSeed(block i's tokens as little-endian
//                     int32, block_size * 4 bytes, hash(block i-1) or, for
//                     the first block of the sequence, seed(ns))
//
// So two sequences share hash(i) exactly when they share the namespace and
// every token of blocks 0..i (up to 64-bit collisions), whatever the radix
// tree's node boundaries are, and the same tokens in two namespaces get
// different hashes.

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hicache {

class BlockHashes {
 public:
  static uint64_t Seed(absl::string_view ns, uint64_t hash_seed);
  static uint64_t Next(uint64_t previous, absl::Span<const int32_t> block);
  // Appends the hashes of tokens.size() / block_size whole blocks after a
  // block hashed `previous` to *out; returns the last one (`previous` if
  // there is none). A partial last block is ignored.
  static uint64_t Chain(uint64_t previous, absl::Span<const int32_t> tokens,
                        uint32_t block_size, std::vector<uint64_t>* out);
};

}  // namespace hicache
