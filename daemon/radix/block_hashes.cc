#include "daemon/radix/block_hashes.h"

#include "xxhash.h"

namespace hicache {

uint64_t BlockHashes::Seed(absl::string_view ns, uint64_t hash_seed) {
  return XXH3_64bits_withSeed(ns.data(), ns.size(), hash_seed);
}

uint64_t BlockHashes::Next(uint64_t previous,
                           absl::Span<const int32_t> block) {
  static_assert(sizeof(int32_t) == 4);
  // Token ids are hashed in memory order: little-endian on every platform
  // the daemon builds for (x86-64, aarch64).
  return XXH3_64bits_withSeed(block.data(), sizeof(int32_t) * block.size(),
                              previous);
}

uint64_t BlockHashes::Chain(uint64_t previous,
                            absl::Span<const int32_t> tokens,
                            uint32_t block_size, std::vector<uint64_t>* out) {
  const size_t blocks = tokens.size() / block_size;
  for (size_t i = 0; i < blocks; ++i) {
    previous = Next(previous, tokens.subspan(i * block_size, block_size));
    out->push_back(previous);
  }
  return previous;
}

}  // namespace hicache
