// Allocator benchmarks. Each reports per-operation latency percentiles
// (median_us, p99_us) measured around every single call, besides Google
// Benchmark's mean.
//
//   bazel run --config=opt //bench:alloc_bench -- --benchmark_repetitions=3
#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "bench/latencies.h"
#include "benchmark/benchmark.h"
#include "daemon/alloc/device_page_allocator.h"
#include "daemon/alloc/host_page_allocator.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"

namespace hicache {
namespace {

// Device: AllocateWithOwners of 2048 zigzag pages, C = 8, on a pool that random
// allocations and frees have left half full.
void BM_DeviceAllocateWithOwners(benchmark::State& state) {
  constexpr uint32_t kCp = 8;
  constexpr int64_t kPagesPerLane = 1 << 16;  // 524288 logical pages.
  const CpLayout layout = *CpLayout::Create(64, kCp);
  auto alloc = *DevicePageAllocator::Create(layout, kPagesPerLane * kCp);
  std::mt19937_64 rng(7);
  std::vector<std::vector<LogicalPage>> held;
  int64_t used = 0;
  const int64_t target = alloc.available() / 2;
  while (used < target || !held.empty()) {
    if (used < target) {
      std::vector<Rank> owners(1 + rng() % 512);
      for (Rank& o : owners) o = rng() % kCp;
      held.push_back(*alloc.AllocateWithOwners(owners));
      used += held.back().size();
    }
    // Free a random earlier batch now and then: fragments the free space.
    if (rng() % 3 == 0 && !held.empty()) {
      const size_t i = rng() % held.size();
      used -= held[i].size();
      (void)alloc.Free(held[i]);
      held[i] = held.back();
      held.pop_back();
    }
    if (used >= target && rng() % 4 == 0) break;
  }
  const std::vector<Rank> owners =
      layout.ComputeOwners(2048, ComputeOwnerMode::kZigzag);
  Latencies allocate, release;
  for (auto _ : state) {
    auto pages =
        allocate.Time([&] { return alloc.AllocateWithOwners(owners); });
    if (!pages.ok()) {
      state.SkipWithError("allocation failed");
      break;
    }
    if (!release.Time([&] { return alloc.Free(*pages); }).ok()) {
      state.SkipWithError("free failed");
      break;
    }
  }
  allocate.Report(state, "alloc_");
  release.Report(state, "free_");
  state.counters["occupancy"] = 1.0 - static_cast<double>(alloc.available()) /
                                          (alloc.usable_pages_per_lane() * kCp);
}
BENCHMARK(BM_DeviceAllocateWithOwners)->Unit(benchmark::kMicrosecond);

// Host: reserve 256 pages contiguous-preferred, then free them, on a pool at
// 50% random occupancy (every page independently used with p = 0.5).
void HostReserveFree(benchmark::State& state, int64_t pages) {
  auto alloc = *HostPageAllocator::Create(pages);
  auto all = *alloc.Reserve(pages);
  std::mt19937_64 rng(11);
  std::vector<int64_t> to_free;
  for (int64_t p : all) {
    if (rng() & 1) to_free.push_back(p);
  }
  (void)alloc.Free(to_free);
  Latencies reserve, release;
  for (auto _ : state) {
    auto got = reserve.Time([&] { return alloc.Reserve(256); });
    if (!got.ok()) {
      state.SkipWithError("reservation failed");
      break;
    }
    if (!release.Time([&] { return alloc.Free(*got); }).ok()) {
      state.SkipWithError("free failed");
      break;
    }
  }
  reserve.Report(state, "reserve_");
  release.Report(state, "free_");
  state.counters["pool_pages"] = static_cast<double>(pages);
  state.counters["free_runs"] = static_cast<double>(alloc.num_free_runs());
  state.counters["largest_run"] = static_cast<double>(alloc.largest_free_run());
}

void BM_HostReserve256_4MPages(benchmark::State& state) {
  HostReserveFree(state, int64_t{4} << 20);
}
BENCHMARK(BM_HostReserve256_4MPages)->Unit(benchmark::kMicrosecond);

// The same on a DeepSeek-V3.2 FP8 geometry with a 220 GB host pool per rank.
void BM_HostReserve256_DeepSeekFp8_220GB(benchmark::State& state) {
  const KvGeometry geometry = *KvGeometry::Preset("deepseek-v3.2-fp8");
  const int64_t pages =
      geometry.SplitHostBudget(uint64_t{220} * 1000 * 1000 * 1000).pages;
  HostReserveFree(state, pages);
}
BENCHMARK(BM_HostReserve256_DeepSeekFp8_220GB)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace hicache
