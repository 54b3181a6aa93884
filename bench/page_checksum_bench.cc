// Host-page checksum throughput (hot restart, issue 15): how fast recovery
// can verify the host tier's pages (VerifyHostPages, XXH3-64 per logical
// page) under both host layouts, on 1 and 2 threads.
//
// The pool is an anonymous, pre-faulted mapping of HICACHE_BENCH_POOL_MIB
// MiB (default 1024) filled with pseudo-random bytes, holding as many whole
// pages of the preset as fit; every page is verified once per iteration, so
// the bytes stream from DRAM, as at a restart. A full deepseek-v3.2-fp8 pool
// (hundreds of GB) does not fit on a test machine; the time to verify N pages
// is N * BytesPerPage / (GB/s) and is reported per 1M pages as "s/1Mpages".
//
//   bazel run --config=opt //bench:page_checksum_bench
//
// Real time is reported (the helper threads' work is not in the main
// thread's CPU time).

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/types/span.h"
#include "benchmark/benchmark.h"
#include "daemon/core/daemon_config.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/page_checksum.h"

namespace hicache {
namespace {

struct PresetCase {
  const char* name;
  uint32_t page_size;
};
constexpr PresetCase kPresets[] = {
    {"tiny", 64}, {"deepseek-v3.2-fp8", 64}, {"micro", 64}};
constexpr HostLayout kLayouts[] = {HostLayout::kLayerFirst,
                                   HostLayout::kPageFirst};

// The shared pool bytes; every (preset, layout) reads the same buffer with
// its own geometry.
absl::Span<const uint8_t> PoolBytes() {
  static const absl::Span<const uint8_t> pool = [] {
    uint64_t mib = 1024;
    if (const char* env = std::getenv("HICACHE_BENCH_POOL_MIB")) {
      mib = std::strtoull(env, nullptr, 10);
    }
    const size_t size = mib << 20;
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (data == MAP_FAILED) {
      std::perror("mmap of the benchmark pool");
      std::abort();
    }
    auto* words = static_cast<uint64_t*>(data);
    uint64_t x = 0x9e3779b97f4a7c15;
    for (size_t i = 0; i < size / 8; ++i) {  // xorshift64
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      words[i] = x;
    }
    return absl::Span<const uint8_t>(static_cast<const uint8_t*>(data), size);
  }();
  return pool;
}

struct Setup {
  KvGeometry geometry;
  HostLayout layout;
  int64_t num_pages;
  std::vector<int64_t> pages;
  std::vector<uint64_t> expected;
};

// Built once per (preset, layout): the expected checksums come from a
// single-threaded pass.
const Setup& GetSetup(int preset, int layout) {
  static auto* setups = new std::map<std::pair<int, int>, Setup>();
  auto it = setups->find({preset, layout});
  if (it != setups->end()) return it->second;
  absl::StatusOr<KvGeometry> geometry =
      KvGeometry::Preset(kPresets[preset].name, kPresets[preset].page_size);
  if (!geometry.ok()) std::abort();
  const int64_t num_pages =
      static_cast<int64_t>(PoolBytes().size() / geometry->BytesPerPage());
  std::vector<int64_t> pages(num_pages);
  for (int64_t p = 0; p < num_pages; ++p) pages[p] = p;
  absl::StatusOr<std::vector<uint64_t>> expected = HostPageChecksums(
      *geometry, kLayouts[layout], num_pages, PoolBytes(), pages);
  if (!expected.ok()) std::abort();
  return setups
      ->emplace(std::pair{preset, layout},
                Setup{*geometry, kLayouts[layout], num_pages, std::move(pages),
                      *std::move(expected)})
      .first->second;
}

// Args: preset index, layout index, threads.
void BM_VerifyHostPages(benchmark::State& state) {
  const Setup& s = GetSetup(static_cast<int>(state.range(0)),
                           static_cast<int>(state.range(1)));
  const int threads = static_cast<int>(state.range(2));
  for (auto _ : state) {
    absl::StatusOr<std::vector<size_t>> bad =
        VerifyHostPages(s.geometry, s.layout, s.num_pages, PoolBytes(),
                        s.pages, s.expected, threads);
    if (!bad.ok() || !bad->empty()) {
      state.SkipWithError("verification failed on unchanged bytes");
      return;
    }
    benchmark::DoNotOptimize(bad->data());
  }
  const double bytes_per_iteration =
      static_cast<double>(s.num_pages) * s.geometry.BytesPerPage();
  const double iterations = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes_per_iteration * iterations));
  state.SetItemsProcessed(static_cast<int64_t>(s.num_pages * iterations));
  state.counters["GB/s"] = benchmark::Counter(
      bytes_per_iteration * iterations / 1e9, benchmark::Counter::kIsRate);
  // Seconds to verify one million pages of this geometry at this rate.
  state.counters["s/1Mpages"] = benchmark::Counter(
      s.num_pages * iterations / 1e6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["pages"] = static_cast<double>(s.num_pages);
  state.counters["page_bytes"] = static_cast<double>(s.geometry.BytesPerPage());
  state.SetLabel(std::string(kPresets[state.range(0)].name) + " " +
                 std::string(HostLayoutName(s.layout)));
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"preset", "layout", "threads"});
  for (int preset = 0; preset < 3; ++preset) {
    for (int layout = 0; layout < 2; ++layout) {
      for (int threads : {1, 2}) b->Args({preset, layout, threads});
    }
  }
}
BENCHMARK(BM_VerifyHostPages)->Apply(Args)->UseRealTime()->Unit(
    benchmark::kMillisecond);

// One page at a time through the single-page API (validation per call), for
// the per-page overhead of small pages.
void BM_HostPageChecksumOne(benchmark::State& state) {
  const Setup& s = GetSetup(static_cast<int>(state.range(0)),
                           static_cast<int>(state.range(1)));
  int64_t page = 0;
  for (auto _ : state) {
    absl::StatusOr<uint64_t> sum = HostPageChecksum(
        s.geometry, s.layout, s.num_pages, PoolBytes(), page);
    benchmark::DoNotOptimize(sum);
    if (++page == s.num_pages) page = 0;
  }
  state.SetBytesProcessed(state.iterations() * s.geometry.BytesPerPage());
  state.SetLabel(std::string(kPresets[state.range(0)].name) + " " +
                 std::string(HostLayoutName(s.layout)));
}
BENCHMARK(BM_HostPageChecksumOne)
    ->ArgNames({"preset", "layout"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({2, 0})
    ->Args({2, 1});

}  // namespace
}  // namespace hicache

BENCHMARK_MAIN();
