#pragma once

// RealCudaRuntime: the CudaRuntime of a GPU, on the CUDA runtime API and the
// batched page-copy kernel of //cuda_kernels (through its plain-typed
// raw_api.h, so this header and its users see no CUDA header).
//
//   * Without a driver or GPU, DeviceCount() is 0 (not an error). In a build
//     without CUDA (HICACHE_DISABLE_CUDA=1 or no nvcc) every call is
//     UNAVAILABLE("this hicached was built without CUDA").
//   * The current CUDA device is per thread and the runtime is used from
//     many threads: every call first selects the device of its stream, event
//     or pointer. Streams and events remember their device.
//   * Streams are non-blocking (no implicit sync with the legacy stream).
//     Errors of asynchronous work are CUDA's: sticky for the context, they
//     surface at the next synchronize / query.
//   * Errors are INTERNAL naming the call and cudaGetErrorString, except:
//     out of memory is RESOURCE_EXHAUSTED; registering registered memory
//     ALREADY_EXISTS; unregistering unknown memory NOT_FOUND; ElapsedMs of
//     an incomplete event FAILED_PRECONDITION; cudaErrorNotSupported
//     UNIMPLEMENTED.
//
// Thread-safe (stateless beyond CUDA's own state).

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/backend/cuda/cuda_runtime.h"

namespace hicache::cuda {

class RealCudaRuntime final : public CudaRuntime {
 public:
  RealCudaRuntime() = default;
  RealCudaRuntime(const RealCudaRuntime&) = delete;
  RealCudaRuntime& operator=(const RealCudaRuntime&) = delete;

  // Whether this binary contains the CUDA kernels and runtime.
  static bool CompiledWithCuda();

  std::string name() const override { return "cuda"; }
  absl::StatusOr<int> DeviceCount() override;
  absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) override;

  absl::StatusOr<void*> DeviceMalloc(int device, size_t bytes) override;
  absl::Status DeviceFree(int device, void* ptr) override;
  absl::Status Memset(void* device_ptr, int value, size_t bytes) override;
  absl::Status CopyToDevice(void* device_dst, const void* host_src,
                            size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* device_src,
                          size_t bytes) override;
  // Any pointer into an allocation gives the allocation's handle; opening it
  // gives the allocation's base.
  absl::StatusOr<std::string> IpcGetMemHandle(void* device_ptr) override;
  absl::StatusOr<void*> IpcOpenMemHandle(int device,
                                         const std::string& handle) override;
  absl::Status IpcCloseMemHandle(void* device_ptr) override;
  absl::Status HostRegister(void* ptr, size_t bytes) override;
  absl::Status HostUnregister(void* ptr) override;
  absl::StatusOr<void*> HostAllocPinned(size_t bytes) override;
  absl::Status HostFreePinned(void* ptr) override;

  absl::StatusOr<Stream> CreateStream(int device) override;
  absl::Status DestroyStream(Stream stream) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::StatusOr<Event> CreateEvent(int device, EventOptions options) override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::StatusOr<float> ElapsedMs(Event start, Event end) override;
  absl::StatusOr<std::string> IpcGetEventHandle(Event event) override;
  // The handle must come from another process (CUDA's rule).
  absl::StatusOr<Event> IpcOpenEventHandle(int device,
                                           const std::string& handle) override;

  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes,
                           Stream stream) override;
  absl::Status LaunchPageCopy(const BatchedPageCopy& copy,
                              Stream stream) override;

  // cudaMemcpyBatchAsync (CUDA 12.8+): `count` copies of sizes[i] bytes from
  // srcs[i] to dsts[i], in stream order, in no order among themselves. For
  // comparing against LaunchPageCopy in benchmarks. The arrays are read
  // during the call. UNIMPLEMENTED (cudaErrorNotSupported) with a toolkit
  // or driver without it.
  absl::Status MemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                                const size_t* sizes, size_t count,
                                Stream stream);
};

}  // namespace hicache::cuda
