#include "daemon/storage/store_key.h"

#include <xxhash.h>

#include <vector>

#include "absl/strings/str_format.h"
#include "daemon/core/le_bytes.h"

namespace hicache {
namespace {

StoreKey FromHash(const XXH128_hash_t& h) {
  return StoreKey{h.high64, h.low64};
}

}  // namespace

std::string StoreKey::ToHex() const {
  return absl::StrFormat("%016x%016x", hi, lo);
}

StoreKey StoreKeyChain::Seed(uint64_t layout, absl::string_view ns) {
  std::string bytes = "hicache-l3-v1";
  LeWriter w(&bytes);
  w.U64(layout);
  w.U64(ns.size());
  w.Bytes(ns);
  return FromHash(XXH3_128bits(bytes.data(), bytes.size()));
}

StoreKey StoreKeyChain::Next(const StoreKey& previous,
                             absl::Span<const int32_t> tokens) {
  std::string bytes;
  bytes.reserve(16 + 4 * tokens.size());
  LeWriter w(&bytes);
  w.U64(previous.hi);
  w.U64(previous.lo);
  for (int32_t t : tokens) w.U32(static_cast<uint32_t>(t));
  return FromHash(XXH3_128bits(bytes.data(), bytes.size()));
}

std::vector<StoreKey> StoreKeyChain::Keys(uint64_t layout, absl::string_view ns,
                                          absl::Span<const int32_t> tokens,
                                          uint32_t page_size, int64_t pages) {
  std::vector<StoreKey> keys;
  keys.reserve(pages);
  StoreKey key = Seed(layout, ns);
  for (int64_t i = 0; i < pages; ++i) {
    key = Next(key, tokens.subspan(i * page_size, page_size));
    keys.push_back(key);
  }
  return keys;
}

}  // namespace hicache
