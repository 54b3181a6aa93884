#pragma once

// The small CUDA runtime surface the CUDA backend is built on. Plain C++: no
// CUDA header, so the backend's orchestration (streams, events, fences,
// per-step completions, failure propagation, page-list packing) compiles and
// is tested on every machine. Two implementations:
//   * RealCudaRuntime (real_cuda_runtime.h): the CUDA runtime and the
//     gather/scatter kernel of //cuda_kernels; UNAVAILABLE without CUDA.
//   * SimCudaRuntime (sim_cuda_runtime.h): device memory in host RAM
//     (shared memory, so "IPC" works across processes), streams as ordered
//     worker queues, events as completion flags, with fault injection.
//
// Semantics follow CUDA: work enqueued on one stream runs in order; a
// recorded event completes when the work enqueued on its stream before the
// record has completed; StreamWaitEvent orders later work of a stream after
// the event's most recent record at the time of the call (an event never
// recorded counts as complete). Errors of asynchronous work surface at the
// next SynchronizeEvent / QueryEvent / SynchronizeStream of that stream's
// events ("sticky" for the stream in the simulation).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hicache::cuda {

// Opaque handles owned by the runtime that created them.
struct StreamTag;
struct EventTag;
using Stream = StreamTag*;
using Event = EventTag*;

// Size of an IPC memory / event handle (cudaIpcMemHandle_t and
// cudaIpcEventHandle_t are both 64 bytes).
inline constexpr size_t kIpcHandleBytes = 64;

struct DeviceInfo {
  std::string name;            // e.g. "NVIDIA H200"
  std::string pci_bus_id;      // e.g. "0000:19:00.0"
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int multiprocessors = 0;
  int compute_capability = 0;  // major * 10 + minor, e.g. 90.
};

// One region of a batched page copy: for every page pair i of the copy,
//   bytes_per_page bytes from src_base + src_offset + src_pages[i] * src_stride
//                       to   dst_base + dst_offset + dst_pages[i] * dst_stride.
// A transfer step is one (family, layer) region per block it copies.
struct CopyRegion {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes_per_page = 0;  // A positive multiple of 4.
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
};

// One kernel launch: every region x every page pair. `descriptors` is
// device-accessible memory (device memory or pinned host memory) holding
//   CopyRegion regions[num_regions];
//   int64_t src_pages[num_pages];
//   int64_t dst_pages[num_pages];
// in that order (PackedCopyBytes gives its size). It is read when the kernel
// runs, so it must stay unchanged until the launch's work has completed.
struct BatchedPageCopy {
  const void* src_base = nullptr;
  void* dst_base = nullptr;
  const void* descriptors = nullptr;
  int32_t num_regions = 0;
  int64_t num_pages = 0;
  // Upper bound on thread blocks (0: the kernel's default); limits the SMs a
  // copy occupies so it does not starve compute ("block quota").
  int32_t max_blocks = 0;
};

inline constexpr size_t PackedCopyBytes(int32_t num_regions,
                                        int64_t num_pages) {
  return sizeof(CopyRegion) * static_cast<size_t>(num_regions) +
         2 * sizeof(int64_t) * static_cast<size_t>(num_pages);
}

struct EventOptions {
  bool interprocess = false;  // Exportable with IpcGetEventHandle.
  bool timing = false;        // Usable with ElapsedMs (not with interprocess).
};

// Thread-safe: every method may be called from any thread.
class CudaRuntime {
 public:
  virtual ~CudaRuntime() = default;

  // "cuda" or "simulated".
  virtual std::string name() const = 0;
  // Usable devices; 0 (not an error) when there is no driver or device.
  virtual absl::StatusOr<int> DeviceCount() = 0;
  virtual absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) = 0;

  // --- Memory -------------------------------------------------------------
  virtual absl::StatusOr<void*> DeviceMalloc(int device, size_t bytes) = 0;
  virtual absl::Status DeviceFree(int device, void* ptr) = 0;
  // Synchronous fill / copies (setup, tests and verification only).
  virtual absl::Status Memset(void* device_ptr, int value, size_t bytes) = 0;
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src,
                                    size_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* device_src,
                                  size_t bytes) = 0;
  // A kIpcHandleBytes handle another process opens with IpcOpenMemHandle.
  virtual absl::StatusOr<std::string> IpcGetMemHandle(void* device_ptr) = 0;
  virtual absl::StatusOr<void*> IpcOpenMemHandle(int device,
                                                 const std::string& handle) = 0;
  virtual absl::Status IpcCloseMemHandle(void* device_ptr) = 0;
  // Pins (page-locks) existing host memory and maps it for the device; the
  // device addresses it at the same pointer (unified addressing).
  virtual absl::Status HostRegister(void* ptr, size_t bytes) = 0;
  virtual absl::Status HostUnregister(void* ptr) = 0;
  // Pinned, device-mapped host memory (staging for page lists).
  virtual absl::StatusOr<void*> HostAllocPinned(size_t bytes) = 0;
  virtual absl::Status HostFreePinned(void* ptr) = 0;

  // --- Streams and events ---------------------------------------------------
  virtual absl::StatusOr<Stream> CreateStream(int device) = 0;
  virtual absl::Status DestroyStream(Stream stream) = 0;
  virtual absl::Status SynchronizeStream(Stream stream) = 0;
  virtual absl::StatusOr<Event> CreateEvent(int device,
                                            EventOptions options) = 0;
  virtual absl::Status DestroyEvent(Event event) = 0;
  virtual absl::Status RecordEvent(Event event, Stream stream) = 0;
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) = 0;
  // Blocks until the event's last record has completed; the error of the
  // stream's failed work if it failed.
  virtual absl::Status SynchronizeEvent(Event event) = 0;
  // true: complete; false: still running; an error as SynchronizeEvent.
  virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  // Milliseconds between two completed timing events.
  virtual absl::StatusOr<float> ElapsedMs(Event start, Event end) = 0;
  virtual absl::StatusOr<std::string> IpcGetEventHandle(Event event) = 0;
  virtual absl::StatusOr<Event> IpcOpenEventHandle(
      int device, const std::string& handle) = 0;

  // --- Work -------------------------------------------------------------------
  // Enqueues a copy of `bytes` between any two addresses the device can
  // reach (device memory, registered or pinned host memory).
  virtual absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes,
                                   Stream stream) = 0;
  // Enqueues the gather/scatter kernel. INVALID_ARGUMENT (nothing enqueued)
  // for a region whose sizes or strides are not positive multiples of 4 or
  // whose stride is below its page size, or null pointers with work to do.
  virtual absl::Status LaunchPageCopy(const BatchedPageCopy& copy,
                                      Stream stream) = 0;
};

// Checks what LaunchPageCopy checks, given the host-side view of the regions
// (both runtimes call it before enqueuing).
absl::Status ValidateRegions(const CopyRegion* regions, int32_t num_regions,
                             int64_t num_pages);

}  // namespace hicache::cuda
