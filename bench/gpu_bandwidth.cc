#include "bench/gpu_bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"

namespace hicache::bench {
namespace {

// --- Bandwidth ---------------------------------------------------------------

struct Timing {
  std::vector<double> ms;          // Between the timing events.
  std::vector<double> enqueue_us;  // Host time of the enqueue call.
  absl::Status status;
};

// Runs `enqueue` warmup + reps times, each between two timing events.
template <typename Fn>
Timing TimeOnStream(BenchContext& ctx, Fn enqueue) {
  Timing t;
  cuda::CudaRuntime& rt = *ctx.runtime;
  for (int i = 0; i < ctx.warmup + ctx.reps; ++i) {
    if (t.status = rt.RecordEvent(ctx.start, ctx.stream); !t.status.ok()) break;
    const int64_t t0 = NowNs();
    t.status = enqueue();
    const int64_t t1 = NowNs();
    if (!t.status.ok()) break;
    if (t.status = rt.RecordEvent(ctx.end, ctx.stream); !t.status.ok()) break;
    if (t.status = rt.SynchronizeEvent(ctx.end); !t.status.ok()) break;
    absl::StatusOr<float> ms = rt.ElapsedMs(ctx.start, ctx.end);
    if (!ms.ok()) {
      t.status = ms.status();
      break;
    }
    if (i < ctx.warmup) continue;
    t.ms.push_back(*ms);
    t.enqueue_us.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  if (!t.status.ok()) (void)rt.SynchronizeStream(ctx.stream);
  return t;
}

// Writes one method's results; returns its median GB/s (NAN on error).
double WriteMethod(JsonWriter& json, absl::string_view key, const Timing& t,
                   uint64_t bytes, absl::string_view note) {
  json.Key(key).BeginObject();
  json.Field("note", note);
  if (!t.status.ok()) {
    json.Field("error", t.status.ToString());
    json.EndObject();
    return NAN;
  }
  std::vector<double> gbps;
  for (double ms : t.ms) gbps.push_back(bytes / (ms * 1e-3) / 1e9);
  const Summary rate = Summarize(gbps);
  WriteSummary(json, "gbps", rate);
  json.Field("ms_median", Summarize(t.ms).median);
  json.Field("enqueue_us_median", Summarize(t.enqueue_us).median);
  json.EndObject();
  return rate.median;
}

// Page indices 0, 2, 4, ... in random order, `count` of them.
std::vector<int64_t> RandomEvenPages(int64_t pool_pages, int64_t count,
                                     std::mt19937_64& rng) {
  std::vector<int64_t> pages;
  for (int64_t p = 0; p < pool_pages; p += 2) pages.push_back(p);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(count);
  return pages;
}

void FillRandom(void* data, uint64_t bytes, uint64_t seed) {
  auto* words = static_cast<uint64_t*>(data);
  uint64_t x = seed | 1;
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
}

// One row size: the buffers, the page choice and the measurements.
class RowBench {
 public:
  RowBench(BenchContext& ctx, uint32_t row) : ctx_(ctx), row_(row) {}

  // Writes one "bandwidth" entry per (direction, layout).
  absl::Status Run(JsonWriter& json);

 private:
  uint64_t DeviceOffset(int64_t page, uint32_t layer) const {
    return (layer * uint64_t(ctx_.pool_pages) + page) * block_;
  }
  uint64_t HostOffset(bool page_first, int64_t page, uint32_t layer) const {
    return page_first ? (page * uint64_t{ctx_.layers} + layer) * block_
                      : DeviceOffset(page, layer);
  }
  absl::Status Setup();
  absl::Status Measure(bool to_host, bool page_first, JsonWriter& json);
  // Compares a sample of the copied blocks with their sources.
  absl::Status Verify(bool to_host, bool page_first);

  BenchContext& ctx_;
  const uint32_t row_;
  uint64_t block_ = 0;
  uint64_t pool_bytes_ = 0;
  uint8_t* device_ = nullptr;
  std::unique_ptr<HostBuffer> host_;
  void* descriptors_ = nullptr;
  std::vector<int64_t> device_pages_;
  std::vector<int64_t> host_pages_;
};

absl::Status RowBench::Setup() {
  cuda::CudaRuntime& rt = *ctx_.runtime;
  absl::StatusOr<void*> device = rt.DeviceMalloc(ctx_.device, pool_bytes_);
  if (!device.ok()) return Annotate(device.status(), "DeviceMalloc");
  device_ = static_cast<uint8_t*>(*device);
  absl::StatusOr<std::unique_ptr<HostBuffer>> host = HostBuffer::Create(
      &rt, absl::StrCat("/hicache-gtb-", getpid(), "-r", row_), pool_bytes_);
  if (!host.ok()) return Annotate(host.status(), "host buffer");
  host_ = *std::move(host);
  if (absl::StatusOr<absl::Duration> d = host_->Register(); !d.ok()) {
    return Annotate(d.status(), "HostRegister");
  }
  absl::StatusOr<void*> descriptors = rt.HostAllocPinned(cuda::PackedCopyBytes(
      static_cast<int32_t>(ctx_.layers), ctx_.copy_pages));
  if (!descriptors.ok()) return Annotate(descriptors.status(), "descriptors");
  descriptors_ = *descriptors;
  std::mt19937_64 rng(row_);
  device_pages_ = RandomEvenPages(ctx_.pool_pages, ctx_.copy_pages, rng);
  host_pages_ = RandomEvenPages(ctx_.pool_pages, ctx_.copy_pages, rng);
  FillRandom(host_->data(), pool_bytes_, 0x9e3779b97f4a7c15ull + row_);
  return absl::OkStatus();
}

absl::Status RowBench::Run(JsonWriter& json) {
  block_ = uint64_t{row_} * ctx_.page_size;
  pool_bytes_ = block_ * ctx_.layers * uint64_t(ctx_.pool_pages);
  absl::Cleanup release = [&] {
    if (descriptors_ != nullptr) {
      (void)ctx_.runtime->HostFreePinned(descriptors_);
    }
    if (device_ != nullptr)
      (void)ctx_.runtime->DeviceFree(ctx_.device, device_);
    host_.reset();
  };
  if (absl::Status s = Setup(); !s.ok()) return s;
  // Host-to-device first: the host holds the random source bytes.
  for (const bool to_host : {false, true}) {
    for (const bool page_first : {false, true}) {
      if (absl::Status s = Measure(to_host, page_first, json); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RowBench::Measure(bool to_host, bool page_first,
                               JsonWriter& json) {
  cuda::CudaRuntime& rt = *ctx_.runtime;
  const uint64_t blocks = uint64_t{ctx_.layers} * ctx_.copy_pages;
  const uint64_t bytes = blocks * block_;
  uint8_t* host = static_cast<uint8_t*>(host_->data());
  // Destination zeroed, source random. The host-to-device runs (first)
  // leave the host's random bytes intact; the first device-to-host run
  // copies them to the device, which device-to-host runs never change.
  if (to_host) {
    if (!page_first) {
      if (absl::Status s = rt.CopyToDevice(device_, host, pool_bytes_);
          !s.ok()) {
        return Annotate(s, "CopyToDevice");
      }
    }
    std::memset(host, 0, pool_bytes_);
  } else if (absl::Status s = rt.Memset(device_, 0, pool_bytes_); !s.ok()) {
    return Annotate(s, "Memset");
  }
  // Descriptors: one region per layer, then the page lists.
  auto* regions = static_cast<cuda::CopyRegion*>(descriptors_);
  const uint64_t host_stride = page_first ? block_ * ctx_.layers : block_;
  for (uint32_t l = 0; l < ctx_.layers; ++l) {
    const uint64_t device_offset = DeviceOffset(0, l);
    const uint64_t host_offset = HostOffset(page_first, 0, l);
    regions[l] =
        cuda::CopyRegion{.src_offset = to_host ? device_offset : host_offset,
                         .dst_offset = to_host ? host_offset : device_offset,
                         .bytes_per_page = block_,
                         .src_stride = to_host ? block_ : host_stride,
                         .dst_stride = to_host ? host_stride : block_};
  }
  auto* src_pages = reinterpret_cast<int64_t*>(regions + ctx_.layers);
  int64_t* dst_pages = src_pages + ctx_.copy_pages;
  const std::vector<int64_t>& src = to_host ? device_pages_ : host_pages_;
  const std::vector<int64_t>& dst = to_host ? host_pages_ : device_pages_;
  std::copy(src.begin(), src.end(), src_pages);
  std::copy(dst.begin(), dst.end(), dst_pages);
  // The same blocks as a list, for cudaMemcpyBatchAsync.
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes(blocks, block_);
  for (uint32_t l = 0; l < ctx_.layers; ++l) {
    for (int64_t i = 0; i < ctx_.copy_pages; ++i) {
      uint8_t* d = device_ + DeviceOffset(device_pages_[i], l);
      uint8_t* h = host + HostOffset(page_first, host_pages_[i], l);
      srcs.push_back(to_host ? d : h);
      dsts.push_back(to_host ? h : d);
    }
  }
  void* src_base = to_host ? static_cast<void*>(device_) : host;
  void* dst_base = to_host ? static_cast<void*>(host) : device_;
  auto kernel = [&](int32_t max_blocks) {
    return rt.LaunchPageCopy(
        cuda::BatchedPageCopy{.src_base = src_base,
                              .dst_base = dst_base,
                              .descriptors = descriptors_,
                              .num_regions = static_cast<int32_t>(ctx_.layers),
                              .num_pages = ctx_.copy_pages,
                              .max_blocks = max_blocks},
        ctx_.stream);
  };

  json.BeginObject();
  json.Field("row_bytes", int64_t{row_});
  json.Field("block_bytes", block_);
  json.Field("direction", to_host ? "d2h" : "h2d");
  json.Field("host_layout", page_first ? "page_first" : "layer_first");
  json.Field("host_page_stride", host_stride);
  json.Field("layers", int64_t{ctx_.layers});
  json.Field("pages", ctx_.copy_pages);
  json.Field("blocks", blocks);
  json.Field("bytes", bytes);
  json.Field("host_memory", host_->kind());
  absl::Status verified = kernel(0);
  if (verified.ok()) verified = rt.SynchronizeStream(ctx_.stream);
  if (verified.ok()) verified = Verify(to_host, page_first);
  json.Field("verified", verified.ok());
  if (!verified.ok()) json.Field("verify_error", verified.ToString());

  json.Key("methods").BeginObject();
  const double kernel_gbps =
      WriteMethod(json, "kernel", TimeOnStream(ctx_, [&] { return kernel(0); }),
                  bytes, "one LaunchPageCopy of every block, max_blocks 0");
  const double quota_gbps = WriteMethod(
      json, "kernel_quota",
      TimeOnStream(ctx_, [&] { return kernel(ctx_.max_blocks); }), bytes,
      absl::StrCat("one LaunchPageCopy, max_blocks ", ctx_.max_blocks));
  const double memcpy_gbps = WriteMethod(
      json, "memcpy",
      TimeOnStream(ctx_,
                   [&] {
                     return rt.MemcpyAsync(dst_base, src_base, bytes,
                                           ctx_.stream);
                   }),
      bytes, "one contiguous cudaMemcpyAsync of the same byte count");
  Timing batch = TimeOnStream(ctx_, [&]() -> absl::Status {
    if (ctx_.real != nullptr) {
      return ctx_.real->MemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                         blocks, ctx_.stream);
    }
    for (uint64_t i = 0; i < blocks; ++i) {  // Simulation: one per block.
      if (absl::Status s =
              rt.MemcpyAsync(dsts[i], srcs[i], sizes[i], ctx_.stream);
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  });
  const double batch_gbps =
      WriteMethod(json, "memcpy_batch", batch, bytes,
                  ctx_.real != nullptr
                      ? "cudaMemcpyBatchAsync of the same block list"
                      : "simulation: one MemcpyAsync per block (no batch API)");
  json.EndObject();
  json.Field("kernel_vs_memcpy", kernel_gbps / memcpy_gbps);
  json.Field("kernel_quota_vs_memcpy", quota_gbps / memcpy_gbps);
  json.Field("memcpy_batch_vs_memcpy", batch_gbps / memcpy_gbps);
  json.EndObject();
  if (!verified.ok()) {
    ctx_.errors.push_back(absl::StrCat(
        "bandwidth row ", row_, " ", to_host ? "d2h " : "h2d ",
        page_first ? "page_first" : "layer_first", ": ", verified.ToString()));
  }
  return absl::OkStatus();
}

absl::Status RowBench::Verify(bool to_host, bool page_first) {
  const uint8_t* host = static_cast<const uint8_t*>(host_->data());
  std::vector<uint8_t> device_block(block_);
  constexpr int64_t kSamples = 16;
  for (int64_t k = 0; k <= kSamples; ++k) {
    const int64_t i =
        std::min(k * ctx_.copy_pages / kSamples, ctx_.copy_pages - 1);
    const uint32_t l = k == kSamples
                           ? ctx_.layers - 1
                           : static_cast<uint32_t>(k * 7) % ctx_.layers;
    if (absl::Status s = ctx_.runtime->CopyToHost(
            device_block.data(), device_ + DeviceOffset(device_pages_[i], l),
            block_);
        !s.ok()) {
      return Annotate(s, "CopyToHost");
    }
    const uint8_t* h = host + HostOffset(page_first, host_pages_[i], l);
    if (std::memcmp(device_block.data(), h, block_) != 0) {
      return absl::DataLossError(absl::StrCat(
          "block (page pair ", i, ", layer ", l, ") differs after the ",
          to_host ? "device-to-host" : "host-to-device", " kernel copy"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void RunBandwidth(BenchContext& ctx, const std::vector<uint32_t>& rows,
                  JsonWriter& json) {
  json.Key("bandwidth").BeginArray();
  for (const uint32_t row : rows) {
    RowBench bench(ctx, row);
    if (absl::Status s = bench.Run(json); !s.ok()) {
      json.BeginObject();
      json.Field("row_bytes", int64_t{row});
      json.Field("error", s.ToString());
      json.EndObject();
      ctx.errors.push_back(
          absl::StrCat("bandwidth row ", row, ": ", s.ToString()));
    }
  }
  json.EndArray();
}

void RunCopyCeiling(BenchContext& ctx, uint64_t bytes, JsonWriter& json) {
  cuda::CudaRuntime& rt = *ctx.runtime;
  json.Key("copy_engine").BeginObject();
  json.Field("bytes", bytes);
  json.Field("note",
             "one cudaMemcpyAsync per rep, pinned host buffer (cudaHostAlloc) "
             "<-> device buffer, as nvbandwidth's host_to_device_memcpy_ce");
  absl::Status status;
  absl::StatusOr<void*> host = rt.HostAllocPinned(bytes);
  absl::StatusOr<void*> device = rt.DeviceMalloc(ctx.device, bytes);
  absl::Cleanup release = [&] {
    if (host.ok()) (void)rt.HostFreePinned(*host);
    if (device.ok()) (void)rt.DeviceFree(ctx.device, *device);
  };
  if (!host.ok() || !device.ok()) {
    status = !host.ok() ? host.status() : device.status();
  } else {
    FillRandom(*host, bytes, 7);
    for (const bool to_host : {false, true}) {
      const Timing t = TimeOnStream(ctx, [&] {
        return to_host ? rt.MemcpyAsync(*host, *device, bytes, ctx.stream)
                       : rt.MemcpyAsync(*device, *host, bytes, ctx.stream);
      });
      if (!t.status.ok()) {
        status = t.status;
        break;
      }
      WriteMethod(json, to_host ? "d2h" : "h2d", t, bytes,
                  to_host ? "device to pinned host" : "pinned host to device");
    }
  }
  if (!status.ok()) {
    json.Field("error", status.ToString());
    ctx.errors.push_back(absl::StrCat("copy_engine: ", status.ToString()));
  }
  json.EndObject();
}

}  // namespace hicache::bench
