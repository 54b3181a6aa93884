// GPU transfer benchmark of the CUDA backend (RealCudaRuntime, one device).
// Prints one JSON document on stdout; on a machine without a GPU (or a build
// without CUDA) it prints {"skipped": "no GPU: ..."} and exits 0.
//
//   bazel run --config=opt //bench:gpu_transfer_bench -- [--quick]
//
// 1. Bandwidth ("bandwidth"), per row size (656 = deepseek-v3.2-fp8 MLA rows,
//    132 = indexer K rows, 1152 = bf16 MLA rows; P tokens per page, so a
//    (page, layer) block is P * row bytes), per direction (d2h into
//    registered shared memory, as the daemon's host pools; h2d from it) and
//    per host layout (layer_first: page stride = block; page_first: page
//    stride = all layers of a page), over the same N random non-adjacent
//    pages x L layers:
//      kernel        one LaunchPageCopy of every block (max_blocks 0)
//      kernel_quota  the same with a block quota (--max_blocks)
//      memcpy        one contiguous cudaMemcpyAsync of the same byte count
//                    (the PCIe ceiling the kernel is compared to)
//      memcpy_batch  cudaMemcpyBatchAsync of the same block list
//    GB/s from timing events around the enqueue on one stream (min / p10 /
//    median / p90 over --reps), the host time of the enqueue call, and the
//    median ratios to memcpy. Once per configuration, 17 of the kernel's
//    copied blocks are compared byte for byte with their sources
//    ("verified").
// 2. Step completion latency ("completion_latency"): a CudaTransferEngine
//    over CudaPoolBackend pools on the device submits one 1-page step at a
//    time. The runtime is wrapped so that a probe event is recorded on the
//    engine's stream right after the step's completion event; the main
//    thread spins on QueryEvent(probe) and stamps when the GPU work was seen
//    complete, the listener stamps OnStepDone; latency = OnStepDone - seen.
//    submit_to_done_us (Submit -> OnStepDone, copy included) is an upper
//    bound.
// 3. Copy-engine ceiling ("copy_engine"): one cudaMemcpyAsync of
//    --ceiling_mib between a pinned host buffer and the device, per
//    direction, as nvbandwidth measures the machine's host<->device copy
//    engines; the kernel's figures above are read against it.
// 4. Pinning ("pin"): --pin_gib of fresh shared memory (a /dev/shm segment
//    as the daemon creates, or an anonymous shared mapping when /dev/shm is
//    too small), HostRegister timed, then HostUnregister timed. Capped to
//    3/4 of MemAvailable (the cap is reported). Skipped with --quick.
//
// Exit status: 0 when every section ran (or skipped: no GPU), 1 when some
// section failed (its "error" says why; the JSON is still printed).
// --runtime=simulated runs the same code on SimCudaRuntime (CPU; numbers
// mean nothing; for checking the benchmark itself without a GPU).

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/gpu_bandwidth.h"
#include "bench/gpu_bench_support.h"
#include "daemon/backend/cuda/cuda_pool_backend.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/backend/cuda/cuda_transfer_engine.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_capacity.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, runtime, "real",
          "real (the GPU) or simulated (SimCudaRuntime: checks the benchmark "
          "code on a CPU; its numbers mean nothing)");
ABSL_FLAG(int, device, 0, "CUDA device ordinal");
ABSL_FLAG(bool, quick, false,
          "fewer repetitions and latency samples, no pinning test");
ABSL_FLAG(int, reps, 0, "timed repetitions per measurement (0: 30; 10 quick)");
ABSL_FLAG(int, warmup, 3, "untimed repetitions before each measurement");
ABSL_FLAG(std::vector<std::string>, rows,
          std::vector<std::string>({"656", "132", "1152"}),
          "row sizes in bytes per token per layer (multiples of 4)");
ABSL_FLAG(int, page_size, 64, "tokens per page");
ABSL_FLAG(int, layers, 61, "layers per copy (regions per launch)");
ABSL_FLAG(int64_t, pool_pages, 256, "pages of the device and host buffers");
ABSL_FLAG(int64_t, copy_pages, 64,
          "pages per copy (at most pool_pages / 2: even pages only, so no "
          "two copied pages are adjacent)");
ABSL_FLAG(int, max_blocks, 32, "block quota of the kernel_quota method");
ABSL_FLAG(int, latency_samples, 0,
          "completion latency samples per direction (0: 500; 100 quick)");
ABSL_FLAG(double, pin_gib, 64, "GiB of host memory to pin (0: skip)");
ABSL_FLAG(int64_t, ceiling_mib, 0,
          "MiB per copy of the copy-engine ceiling (0: 512; 128 quick)");
ABSL_FLAG(std::string, out, "", "also write the JSON document to this file");
ABSL_FLAG(bool, probe, false,
          "only count the GPUs: {\"devices\": N} (and \"note\" when 0), exit "
          "0; the GPU bundle's runner asks this before its tests");

namespace hicache::bench {
namespace {

// --- Completion latency ------------------------------------------------------

// Stamps the time of each OnStepDone.
class StampListener final : public TransferListener {
 public:
  void OnStepDone(StepDone done) override {
    const int64_t now = NowNs();
    ok_.store(done.status.ok(), std::memory_order_relaxed);
    done_ns_.store(now, std::memory_order_release);
  }
  void Reset() { done_ns_.store(0); }
  // 0 until the step is done.
  int64_t done_ns() const { return done_ns_.load(std::memory_order_acquire); }
  bool ok() const { return ok_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> done_ns_{0};
  std::atomic<bool> ok_{false};
};

absl::Status MeasureLatency(BenchContext& ctx, JsonWriter& json) {
  constexpr int64_t kPages = 16;
  constexpr int kWarmup = 20;
  const int64_t timeout_ns = int64_t{5} * 1000 * 1000 * 1000;
  ProbingRuntime probing(ctx.runtime);
  absl::StatusOr<CpLayout> layout = CpLayout::Create(ctx.page_size, 1);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<KvGeometry> geometry =
      KvGeometry::Preset("deepseek-v3.2-fp8", ctx.page_size);
  if (!geometry.ok()) return geometry.status();
  CudaPoolBackend backend(&probing, {ctx.device},
                          absl::StrCat("/hicache-gtb-", getpid(), "-lat"));
  absl::StatusOr<std::unique_ptr<RankPools>> pools =
      RankPools::Create(*layout, *geometry,
                        RankPoolsOptions{.device_pages_per_rank = kPages,
                                         .host_pages_per_rank = kPages},
                        backend);
  if (!pools.ok()) return Annotate(pools.status(), "pools");
  StampListener listener;
  absl::StatusOr<std::unique_ptr<CudaTransferEngine>> engine =
      CudaTransferEngine::Create(
          &probing, pools->get(), &listener,
          CudaTransferEngineOptions{.device_of_rank = {ctx.device}});
  if (!engine.ok()) return Annotate(engine.status(), "engine");
  absl::StatusOr<cuda::Event> probe =
      ctx.runtime->CreateEvent(ctx.device, cuda::EventOptions{.timing = true});
  if (!probe.ok()) return Annotate(probe.status(), "probe event");
  absl::Cleanup destroy_probe = [&] {
    (*engine)->Drain();
    (void)ctx.runtime->DestroyEvent(*probe);
  };
  // The cost of one QueryEvent: how late the poller can see a completion.
  std::vector<double> query_us;
  if (absl::Status s = ctx.runtime->RecordEvent(*probe, ctx.stream); !s.ok()) {
    return s;
  }
  (void)ctx.runtime->SynchronizeEvent(*probe);
  for (int i = 0; i < 1000; ++i) {
    const int64_t t0 = NowNs();
    (void)ctx.runtime->QueryEvent(*probe);
    query_us.push_back(static_cast<double>(NowNs() - t0) / 1e3);
  }

  json.Key("completion_latency").BeginObject();
  json.Field("method",
             "1-page steps of deepseek-v3.2-fp8 (step 0: one MLA and one "
             "indexer block) through CudaTransferEngine, one at a time; a "
             "probe event recorded on the engine's stream right after the "
             "step's completion event is polled with QueryEvent by a "
             "spinning thread; latency_us = OnStepDone time - time the "
             "poller saw the probe complete (negative: the listener was "
             "first); submit_to_done_us = Submit -> OnStepDone, an upper "
             "bound that includes the copy");
  json.Field("engine_completion",
             "one thread per stream blocking in "
             "SynchronizeEvent (cudaEventBlockingSync)");
  json.Field("query_event_us_median", Summarize(query_us).median);
  absl::Status status;
  for (const TransferDirection direction :
       {TransferDirection::kDeviceToHost, TransferDirection::kHostToDevice}) {
    std::vector<double> latency_us;
    std::vector<double> submit_us;
    for (int i = 0; i < kWarmup + ctx.latency_samples && status.ok(); ++i) {
      const int64_t page = 1 + i % (kPages - 1);
      TransferTask task{
          .op_id = static_cast<uint64_t>(i + 1),
          .direction = direction,
          .step = 0,
          .ranks = {RankCopy{
              .rank = 0, .device_pages = {page}, .host_pages = {page}}}};
      listener.Reset();
      probing.Arm(*probe);
      const int64_t submitted = NowNs();
      if (status = (*engine)->Submit(std::move(task)); !status.ok()) break;
      if (!probing.probe_recorded()) {
        status = absl::InternalError("the probe event was not recorded");
        break;
      }
      int64_t seen = 0;
      while (seen == 0) {
        absl::StatusOr<bool> complete = ctx.runtime->QueryEvent(*probe);
        if (!complete.ok()) {
          status = Annotate(complete.status(), "QueryEvent(probe)");
          break;
        }
        if (*complete) seen = NowNs();
        if (NowNs() - submitted > timeout_ns) {
          status =
              absl::DeadlineExceededError("a step did not complete in 5 s");
          break;
        }
      }
      int64_t done = 0;
      while (status.ok() && (done = listener.done_ns()) == 0) {
        if (NowNs() - submitted > timeout_ns) {
          status = absl::DeadlineExceededError("no OnStepDone within 5 s");
        }
      }
      if (status.ok() && !listener.ok()) {
        status = absl::InternalError("a step failed (see the log)");
      }
      if (!status.ok() || i < kWarmup) continue;
      latency_us.push_back(static_cast<double>(done - seen) / 1e3);
      submit_us.push_back(static_cast<double>(done - submitted) / 1e3);
    }
    json.Key(direction == TransferDirection::kDeviceToHost ? "d2h" : "h2d")
        .BeginObject();
    WriteSummary(json, "latency_us", Summarize(latency_us));
    WriteSummary(json, "submit_to_done_us", Summarize(submit_us));
    json.EndObject();
  }
  if (!status.ok()) json.Field("error", status.ToString());
  json.EndObject();
  return status;
}

// --- Pinning -----------------------------------------------------------------

absl::Status MeasurePin(BenchContext& ctx, double gib, JsonWriter& json) {
  constexpr uint64_t kGiB = 1ull << 30;
  constexpr uint64_t kAlign = 2ull << 20;
  const uint64_t requested =
      static_cast<uint64_t>(gib * kGiB) / kAlign * kAlign;
  absl::StatusOr<uint64_t> available = MemAvailableBytes();
  absl::StatusOr<uint64_t> shm_free = ShmFreeBytes();
  uint64_t bytes = requested;
  std::string cap_reason;
  if (available.ok() && bytes > *available / 4 * 3) {
    bytes = *available / 4 * 3 / kAlign * kAlign;
    cap_reason = absl::StrCat("3/4 of MemAvailable (", *available, " bytes)");
  }
  json.Key("pin").BeginObject();
  json.Field("requested_bytes", requested);
  json.Field("bytes", bytes);
  json.Field("capped", bytes < requested);
  if (!cap_reason.empty()) json.Field("cap_reason", cap_reason);
  if (available.ok()) json.Field("mem_available_bytes", *available);
  if (shm_free.ok()) json.Field("shm_free_bytes", *shm_free);
  absl::Status status;
  absl::StatusOr<std::unique_ptr<HostBuffer>> buffer =
      absl::ResourceExhaustedError("no memory to pin");
  if (bytes > 0) {
    buffer = HostBuffer::Create(
        ctx.runtime, absl::StrCat("/hicache-gtb-", getpid(), "-pin"), bytes);
  }
  if (!buffer.ok()) {
    status = Annotate(buffer.status(), "host buffer");
  } else {
    json.Field("memory", (*buffer)->kind());
    absl::StatusOr<absl::Duration> reg = (*buffer)->Register();
    if (!reg.ok()) {
      status = Annotate(reg.status(), "HostRegister");
    } else {
      const double seconds = absl::ToDoubleSeconds(*reg);
      json.Field("register_s", seconds);
      json.Field("register_gib_per_s", bytes / double(kGiB) / seconds);
      absl::StatusOr<absl::Duration> unreg = (*buffer)->Unregister();
      if (unreg.ok()) {
        json.Field("unregister_s", absl::ToDoubleSeconds(*unreg));
      } else {
        status = Annotate(unreg.status(), "HostUnregister");
      }
    }
    const int64_t t0 = NowNs();
    buffer->reset();
    json.Field("release_s", static_cast<double>(NowNs() - t0) / 1e9);
  }
  if (!status.ok()) json.Field("error", status.ToString());
  json.EndObject();
  return status;
}

// --- Main --------------------------------------------------------------------

void Emit(const std::string& document) {
  std::fputs(document.c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    std::ofstream(out) << document << "\n";
  }
}

int Main() {
  std::unique_ptr<cuda::CudaRuntime> runtime;
  BenchContext ctx;
  const std::string kind = absl::GetFlag(FLAGS_runtime);
  if (kind == "simulated") {
    runtime = std::make_unique<cuda::SimCudaRuntime>();
  } else if (kind == "real") {
    auto real = std::make_unique<cuda::RealCudaRuntime>();
    ctx.real = real.get();
    runtime = std::move(real);
  } else {
    std::fprintf(stderr, "--runtime must be real or simulated\n");
    return 2;
  }
  ctx.runtime = runtime.get();
  ctx.device = absl::GetFlag(FLAGS_device);
  absl::StatusOr<int> devices = runtime->DeviceCount();
  if (absl::GetFlag(FLAGS_probe)) {
    JsonWriter json;
    json.BeginObject().Field("devices", devices.ok() ? *devices : 0);
    if (!devices.ok() || *devices == 0) {
      json.Field("note", devices.ok() ? std::string("0 CUDA devices visible")
                                      : devices.status().ToString());
    }
    Emit(json.EndObject().str());
    return 0;
  }
  if (!devices.ok() || *devices == 0) {
    if (devices.ok() || absl::IsUnavailable(devices.status())) {
      JsonWriter json;
      json.BeginObject().Field(
          "skipped",
          absl::StrCat("no GPU: ", devices.ok() ? "0 CUDA devices visible"
                                                : devices.status().message()));
      Emit(json.EndObject().str());
      return 0;
    }
    std::fprintf(stderr, "DeviceCount: %s\n",
                 devices.status().ToString().c_str());
    return 1;
  }
  const bool quick = absl::GetFlag(FLAGS_quick);
  ctx.reps = absl::GetFlag(FLAGS_reps) > 0 ? absl::GetFlag(FLAGS_reps)
                                           : (quick ? 10 : 30);
  ctx.warmup = std::max(0, absl::GetFlag(FLAGS_warmup));
  ctx.page_size = static_cast<uint32_t>(absl::GetFlag(FLAGS_page_size));
  ctx.layers = static_cast<uint32_t>(absl::GetFlag(FLAGS_layers));
  ctx.pool_pages = absl::GetFlag(FLAGS_pool_pages);
  ctx.copy_pages = absl::GetFlag(FLAGS_copy_pages);
  ctx.max_blocks = absl::GetFlag(FLAGS_max_blocks);
  ctx.latency_samples = absl::GetFlag(FLAGS_latency_samples) > 0
                            ? absl::GetFlag(FLAGS_latency_samples)
                            : (quick ? 100 : 500);
  const double pin_gib = quick ? 0 : absl::GetFlag(FLAGS_pin_gib);
  std::vector<uint32_t> rows;
  for (const std::string& text : absl::GetFlag(FLAGS_rows)) {
    uint32_t row = 0;
    if (!absl::SimpleAtoi(text, &row) || row == 0 || row % 4 != 0) {
      std::fprintf(stderr, "--rows: %s is not a positive multiple of 4\n",
                   text.c_str());
      return 2;
    }
    rows.push_back(row);
  }
  if (ctx.layers == 0 || ctx.copy_pages <= 0 || ctx.page_size == 0 ||
      ctx.pool_pages < 2 * ctx.copy_pages || ctx.device < 0 ||
      ctx.device >= *devices) {
    std::fprintf(stderr,
                 "need --layers > 0, 0 < --copy_pages <= --pool_pages / 2, "
                 "--page_size > 0 and --device < %d\n",
                 *devices);
    return 2;
  }
  const int64_t started = NowNs();
  JsonWriter json;
  json.BeginObject();
  json.Field("bench", "gpu_transfer_bench");
  json.Field("runtime", runtime->name());
  json.Field("quick", quick);
  absl::StatusOr<cuda::DeviceInfo> info = runtime->GetDeviceInfo(ctx.device);
  json.Key("device").BeginObject();
  json.Field("ordinal", ctx.device);
  if (info.ok()) {
    json.Field("name", info->name);
    json.Field("pci_bus_id", info->pci_bus_id);
    json.Field("total_bytes", info->total_bytes);
    json.Field("multiprocessors", info->multiprocessors);
    json.Field("compute_capability", info->compute_capability);
  }
  json.EndObject();
  json.Key("config").BeginObject();
  json.Field("page_size", int64_t{ctx.page_size});
  json.Field("layers", int64_t{ctx.layers});
  json.Field("pool_pages", ctx.pool_pages);
  json.Field("copy_pages", ctx.copy_pages);
  json.Field("reps", ctx.reps);
  json.Field("warmup", ctx.warmup);
  json.Field("max_blocks_quota", ctx.max_blocks);
  json.Field("latency_samples", ctx.latency_samples);
  json.Field("pin_gib", pin_gib);
  json.EndObject();

  absl::StatusOr<cuda::Stream> stream = runtime->CreateStream(ctx.device);
  absl::StatusOr<cuda::Event> start =
      runtime->CreateEvent(ctx.device, cuda::EventOptions{.timing = true});
  absl::StatusOr<cuda::Event> end =
      runtime->CreateEvent(ctx.device, cuda::EventOptions{.timing = true});
  if (!stream.ok() || !start.ok() || !end.ok()) {
    absl::Status s = !stream.ok()
                         ? stream.status()
                         : (!start.ok() ? start.status() : end.status());
    ctx.errors.push_back(absl::StrCat("setup: ", s.ToString()));
  } else {
    ctx.stream = *stream;
    ctx.start = *start;
    ctx.end = *end;
    RunBandwidth(ctx, rows, json);
    const int64_t ceiling_mib = absl::GetFlag(FLAGS_ceiling_mib) > 0
                                    ? absl::GetFlag(FLAGS_ceiling_mib)
                                    : (quick ? 128 : 512);
    RunCopyCeiling(ctx, static_cast<uint64_t>(ceiling_mib) << 20, json);
    if (ctx.latency_samples > 0) {
      if (absl::Status s = MeasureLatency(ctx, json); !s.ok()) {
        ctx.errors.push_back(
            absl::StrCat("completion_latency: ", s.ToString()));
      }
    }
    (void)runtime->DestroyEvent(ctx.start);
    (void)runtime->DestroyEvent(ctx.end);
    (void)runtime->DestroyStream(ctx.stream);
  }
  if (pin_gib > 0) {
    if (absl::Status s = MeasurePin(ctx, pin_gib, json); !s.ok()) {
      ctx.errors.push_back(absl::StrCat("pin: ", s.ToString()));
    }
  } else {
    json.Key("pin").BeginObject();
    json.Field("skipped", quick ? "--quick" : "--pin_gib=0");
    json.EndObject();
  }
  json.Key("errors").BeginArray();
  for (const std::string& e : ctx.errors) json.String(e);
  json.EndArray();
  json.Field("wall_s", static_cast<double>(NowNs() - started) / 1e9);
  json.EndObject();
  Emit(json.str());
  return ctx.errors.empty() ? 0 : 1;
}

}  // namespace
}  // namespace hicache::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "GPU transfer benchmark of the CUDA backend; one JSON document on "
      "stdout (see the top of bench/gpu_transfer_bench.cc)");
  absl::ParseCommandLine(argc, argv);
  // Library logs (pool creation) go to stderr: stdout is the JSON document.
  spdlog::set_default_logger(spdlog::stderr_color_mt("gpu_transfer_bench"));
  return hicache::bench::Main();
}
