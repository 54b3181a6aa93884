#pragma once

// Helpers of //bench:gpu_transfer_bench: the measurements' shared context,
// a small JSON writer, percentile summaries, host buffers mapped like the
// daemon's host pools, and a CudaRuntime decorator that records a probe event
// right after a recorded event (to see when the GPU finished a transfer
// engine's step).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/pool/shm_pool.h"

namespace hicache::bench {

// What every measurement shares.
struct BenchContext {
  cuda::CudaRuntime* runtime = nullptr;
  cuda::RealCudaRuntime* real = nullptr;  // Null on the simulation.
  int device = 0;
  cuda::Stream stream = nullptr;
  cuda::Event start = nullptr;  // Timing events.
  cuda::Event end = nullptr;
  int reps = 30;
  int warmup = 3;
  uint32_t page_size = 64;
  uint32_t layers = 61;
  int64_t pool_pages = 256;
  int64_t copy_pages = 64;
  int32_t max_blocks = 32;
  int latency_samples = 500;
  std::vector<std::string> errors;  // "section: message".
};

// Steady-clock nanoseconds.
int64_t NowNs();

// `status` with "what: " in front of its message, same code.
absl::Status Annotate(const absl::Status& status, absl::string_view what);

// Writes one JSON document, indented by two spaces. The caller nests
// Begin/End calls correctly and calls Key before every value in an object.
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(absl::string_view key);
  JsonWriter& String(absl::string_view value);
  // Non-finite numbers are written as null.
  JsonWriter& Number(double value);
  JsonWriter& Int(int64_t value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();

  // Key followed by a value.
  JsonWriter& Field(absl::string_view key, absl::string_view value) {
    return Key(key).String(value);
  }
  JsonWriter& Field(absl::string_view key, const char* value) {
    return Key(key).String(value);
  }
  JsonWriter& Field(absl::string_view key, const std::string& value) {
    return Key(key).String(value);
  }
  JsonWriter& Field(absl::string_view key, double value) {
    return Key(key).Number(value);
  }
  JsonWriter& Field(absl::string_view key, int64_t value) {
    return Key(key).Int(value);
  }
  JsonWriter& Field(absl::string_view key, uint64_t value) {
    return Key(key).Int(static_cast<int64_t>(value));
  }
  JsonWriter& Field(absl::string_view key, int value) {
    return Key(key).Int(value);
  }
  JsonWriter& Field(absl::string_view key, bool value) {
    return Key(key).Bool(value);
  }

  // The document so far (complete once every Begin has its End).
  const std::string& str() const { return out_; }

 private:
  // Comma, newline and indentation before a value or key.
  void BeforeValue();
  void Open(char bracket);
  void Close(char bracket);

  std::string out_;
  std::vector<bool> empty_;  // Per open container: nothing written yet.
  bool after_key_ = false;
};

// `text` as a JSON string literal, quotes included.
std::string JsonQuote(absl::string_view text);

// Order statistics of a sample (linear interpolation between ranks).
struct Summary {
  size_t count = 0;
  double min = 0;
  double p10 = 0;
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};
Summary Summarize(std::vector<double> samples);
// {"count", "min", "p10", "median", "p90", "p99", "max"} as a JSON object.
void WriteSummary(JsonWriter& json, absl::string_view key,
                  const Summary& summary);

// /proc/meminfo's MemAvailable, in bytes.
absl::StatusOr<uint64_t> MemAvailableBytes();

// Shared host memory, mapped the way the daemon maps a host pool: a POSIX
// shared-memory segment (ShmPool) when /dev/shm has room for it, otherwise
// an anonymous shared mapping (same kind of pages, not bounded by the size
// of /dev/shm; e.g. a container's 64 MiB /dev/shm). Fresh (untouched)
// memory, as a new pool is. Register() pins it for the device with
// HostRegister; the destructor unregisters (if registered) and unmaps.
class HostBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<HostBuffer>> Create(
      cuda::CudaRuntime* runtime, const std::string& shm_name, uint64_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return bytes_; }
  // "shm <name>" or "anonymous shared mapping".
  const std::string& kind() const { return kind_; }

  // How long HostRegister / HostUnregister took.
  absl::StatusOr<absl::Duration> Register();
  absl::StatusOr<absl::Duration> Unregister();

 private:
  HostBuffer(cuda::CudaRuntime* runtime, std::unique_ptr<ShmPool> shm,
             void* anonymous, uint64_t bytes, std::string kind);

  cuda::CudaRuntime* const runtime_;
  const std::unique_ptr<ShmPool> shm_;  // Null for an anonymous mapping.
  void* const anonymous_;               // Null for a segment.
  void* const data_;
  const uint64_t bytes_;
  const std::string kind_;
  bool registered_ = false;
};

// Forwards every call to `base`. Once armed with an event, the next
// RecordEvent (of any event, on any stream) is followed by a record of the
// armed event on the same stream, and the arming is consumed: the probe
// completes right after the recorded event does. Thread-safe.
class ProbingRuntime final : public cuda::CudaRuntime {
 public:
  explicit ProbingRuntime(cuda::CudaRuntime* base) : base_(base) {}

  // `probe` must be on the device of the stream the next record uses.
  void Arm(cuda::Event probe) {
    probe_recorded_.store(false);
    armed_.store(probe);
  }
  // Whether the last arming was consumed (and its record accepted).
  bool probe_recorded() const { return probe_recorded_.load(); }

  std::string name() const override { return base_->name(); }
  absl::StatusOr<int> DeviceCount() override { return base_->DeviceCount(); }
  absl::StatusOr<cuda::DeviceInfo> GetDeviceInfo(int device) override {
    return base_->GetDeviceInfo(device);
  }
  absl::StatusOr<void*> DeviceMalloc(int device, size_t bytes) override {
    return base_->DeviceMalloc(device, bytes);
  }
  absl::Status DeviceFree(int device, void* ptr) override {
    return base_->DeviceFree(device, ptr);
  }
  absl::Status Memset(void* device_ptr, int value, size_t bytes) override {
    return base_->Memset(device_ptr, value, bytes);
  }
  absl::Status CopyToDevice(void* device_dst, const void* host_src,
                            size_t bytes) override {
    return base_->CopyToDevice(device_dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* device_src,
                          size_t bytes) override {
    return base_->CopyToHost(host_dst, device_src, bytes);
  }
  absl::StatusOr<std::string> IpcGetMemHandle(void* device_ptr) override {
    return base_->IpcGetMemHandle(device_ptr);
  }
  absl::StatusOr<void*> IpcOpenMemHandle(int device,
                                         const std::string& handle) override {
    return base_->IpcOpenMemHandle(device, handle);
  }
  absl::Status IpcCloseMemHandle(void* device_ptr) override {
    return base_->IpcCloseMemHandle(device_ptr);
  }
  absl::Status HostRegister(void* ptr, size_t bytes) override {
    return base_->HostRegister(ptr, bytes);
  }
  absl::Status HostUnregister(void* ptr) override {
    return base_->HostUnregister(ptr);
  }
  absl::StatusOr<void*> HostAllocPinned(size_t bytes) override {
    return base_->HostAllocPinned(bytes);
  }
  absl::Status HostFreePinned(void* ptr) override {
    return base_->HostFreePinned(ptr);
  }
  absl::StatusOr<cuda::Stream> CreateStream(int device) override {
    return base_->CreateStream(device);
  }
  absl::Status DestroyStream(cuda::Stream stream) override {
    return base_->DestroyStream(stream);
  }
  absl::Status SynchronizeStream(cuda::Stream stream) override {
    return base_->SynchronizeStream(stream);
  }
  absl::StatusOr<cuda::Event> CreateEvent(int device,
                                          cuda::EventOptions options) override {
    return base_->CreateEvent(device, options);
  }
  absl::Status DestroyEvent(cuda::Event event) override {
    return base_->DestroyEvent(event);
  }
  absl::Status RecordEvent(cuda::Event event, cuda::Stream stream) override;
  absl::Status StreamWaitEvent(cuda::Stream stream,
                               cuda::Event event) override {
    return base_->StreamWaitEvent(stream, event);
  }
  absl::Status SynchronizeEvent(cuda::Event event) override {
    return base_->SynchronizeEvent(event);
  }
  absl::StatusOr<bool> QueryEvent(cuda::Event event) override {
    return base_->QueryEvent(event);
  }
  absl::StatusOr<float> ElapsedMs(cuda::Event start, cuda::Event end) override {
    return base_->ElapsedMs(start, end);
  }
  absl::StatusOr<std::string> IpcGetEventHandle(cuda::Event event) override {
    return base_->IpcGetEventHandle(event);
  }
  absl::StatusOr<cuda::Event> IpcOpenEventHandle(
      int device, const std::string& handle) override {
    return base_->IpcOpenEventHandle(device, handle);
  }
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes,
                           cuda::Stream stream) override {
    return base_->MemcpyAsync(dst, src, bytes, stream);
  }
  absl::Status LaunchPageCopy(const cuda::BatchedPageCopy& copy,
                              cuda::Stream stream) override {
    return base_->LaunchPageCopy(copy, stream);
  }

 private:
  cuda::CudaRuntime* const base_;
  std::atomic<cuda::Event> armed_{nullptr};
  std::atomic<bool> probe_recorded_{false};
};

}  // namespace hicache::bench
