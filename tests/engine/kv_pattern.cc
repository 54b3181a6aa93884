#include "tests/engine/kv_pattern.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace hicache::testing {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

std::vector<uint64_t> PrefixHashes(absl::Span<const int32_t> tokens) {
  std::vector<uint64_t> hashes(tokens.size());
  uint64_t h = 1;
  for (size_t i = 0; i < tokens.size(); ++i) hashes[i] = h = Mix(h, tokens[i]);
  return hashes;
}

uint32_t Word(uint64_t prefix_hash, int family, uint32_t layer, uint32_t w) {
  return static_cast<uint32_t>(
      Mix(Mix(prefix_hash, family * 1000003 + layer), w));
}

// Calls fn(row pointer, row words, token index, family, layer) for every
// token row of tokens [from, to) in `pages`.
template <typename Fn>
void ForEachRow(const HiCacheEngine& engine,
                absl::Span<const LogicalPage> pages, int64_t from, int64_t to,
                Fn fn) {
  const KvGeometry& g = engine.geometry();
  const CpLayout& layout = engine.layout();
  const int64_t per_rank = engine.options().device_pages_per_rank;
  const int64_t page = layout.page_size();
  for (int64_t t = from; t < to; ++t) {
    const LogicalPage logical = pages[t / page];
    const Rank rank = layout.LaneOf(logical);
    // The CPU backend maps device pools into this process; the simulated
    // CUDA runtime keeps "device" memory in host RAM (backend_data). Tests on
    // a real GPU copy through the runtime instead of using these helpers.
    const KvPool* pool = engine.pools().device(rank);
    char* base = static_cast<char*>(pool->host_data() != nullptr
                                        ? pool->host_data()
                                        : pool->backend_data());
    for (int f = 0; f < static_cast<int>(g.families().size()); ++f) {
      const uint32_t row = g.families()[f].bytes_per_token;
      for (uint32_t l = 0; l < g.families()[f].num_layers; ++l) {
        char* block =
            base +
            g.DeviceOffset(per_rank, layout.PhysicalPageOf(logical), f, l);
        fn(reinterpret_cast<uint32_t*>(block + (t % page) * row), row / 4, t, f,
           l);
      }
    }
  }
}

}  // namespace

void WriteKv(const HiCacheEngine& engine, absl::Span<const int32_t> tokens,
             absl::Span<const LogicalPage> pages, int64_t from_token) {
  const std::vector<uint64_t> hashes = PrefixHashes(tokens);
  ForEachRow(engine, pages, from_token, tokens.size(),
             [&](uint32_t* row, uint32_t words, int64_t t, int f, uint32_t l) {
               for (uint32_t w = 0; w < words; ++w) {
                 row[w] = Word(hashes[t], f, l, w);
               }
             });
}

absl::Status VerifyKv(const HiCacheEngine& engine,
                      absl::Span<const int32_t> tokens,
                      absl::Span<const LogicalPage> pages, int64_t valid) {
  const std::vector<uint64_t> hashes = PrefixHashes(tokens);
  absl::Status status;
  ForEachRow(engine, pages, 0, valid,
             [&](uint32_t* row, uint32_t words, int64_t t, int f, uint32_t l) {
               if (!status.ok()) return;
               for (uint32_t w = 0; w < words; ++w) {
                 if (row[w] != Word(hashes[t], f, l, w)) {
                   status = absl::DataLossError(
                       absl::StrCat("wrong KV: token ", t, " page ",
                                    pages[t / engine.layout().page_size()],
                                    " family ", f, " layer ", l, " word ", w));
                   return;
                 }
               }
             });
  return status;
}

}  // namespace hicache::testing
