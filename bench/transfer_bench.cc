// CPU transfer backend throughput against a plain memcpy of the same bytes on
// the same machine: 32 pages of DeepSeek-V3.2 FP8 KV (every layer, target and
// draft, MLA and indexer rows), device -> host, one rank, one worker thread.
//
//   bazel run --config=opt //bench:transfer_bench -- --benchmark_repetitions=5
//
//       --benchmark_report_aggregates_only=true
#include <unistd.h>

#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "daemon/pool/shm_pool.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"

namespace hicache {
namespace {

constexpr int64_t kPoolPages = 96;
constexpr int64_t kCopyPages = 32;

class NullListener : public TransferListener {
 public:
  void OnStepDone(StepDone) override {}
};

struct Setup {
  explicit Setup(HostLayout layout) {
    static int counter = 0;
    backend = std::make_unique<ShmPoolBackend>(
        absl::StrCat("/hicache-tb-", getpid(), "-", counter++));
    pools = *RankPools::Create(*CpLayout::Create(64, 1),
                               *KvGeometry::Preset("deepseek-v3.2-fp8"),
                               {.device_pages_per_rank = kPoolPages,
                                .host_pages_per_rank = kPoolPages,
                                .host_layout = layout},
                               *backend);
    std::memset(pools->device(0)->host_data(), 7,
                pools->device(0)->size_bytes());
    std::memset(pools->host(0)->host_data(), 0, pools->host(0)->size_bytes());
    engine = std::make_unique<CpuTransferEngine>(pools.get(), &listener, 1);
  }
  NullListener listener;
  std::unique_ptr<ShmPoolBackend> backend;
  std::unique_ptr<RankPools> pools;
  std::unique_ptr<CpuTransferEngine> engine;
};

void BM_CpuBackendAllLayers(benchmark::State& state) {
  Setup setup(static_cast<HostLayout>(state.range(0)));
  RankCopy copy{0, {}, {}};
  for (int64_t i = 0; i < kCopyPages; ++i) {
    copy.device_pages.push_back(1 + i);             // One physical run.
    copy.host_pages.push_back(kPoolPages - 1 - i);  // Reversed: no host runs.
  }
  if (state.range(1) == 1) {  // Both sides contiguous: coalesced runs.
    for (int64_t i = 0; i < kCopyPages; ++i) copy.host_pages[i] = 1 + i;
  }
  const uint32_t steps = setup.pools->geometry().NumSteps();
  uint64_t bytes = 0;
  for (auto _ : state) {
    for (uint32_t step = 0; step < steps; ++step) {
      TransferTask task{.op_id = 1,
                        .direction = TransferDirection::kDeviceToHost,
                        .step = step,
                        .ranks = {copy}};
      bytes += *setup.engine->CopyNow(task);
    }
  }
  state.SetBytesProcessed(bytes);
}
// Args: host layout (0 layer-first, 1 page-first), contiguous host pages.
BENCHMARK(BM_CpuBackendAllLayers)
    ->Args({0, 1})
    ->Args({0, 0})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond);

void BM_PlainMemcpySameBytes(benchmark::State& state) {
  const KvGeometry g = *KvGeometry::Preset("deepseek-v3.2-fp8");
  const size_t bytes = g.BytesPerPage() * kCopyPages;
  std::vector<char> src(bytes, 7), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}
BENCHMARK(BM_PlainMemcpySameBytes)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace hicache
