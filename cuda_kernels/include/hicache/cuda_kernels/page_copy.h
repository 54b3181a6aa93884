#pragma once

// Host-side API of the CUDA kernels. Plain C++: includes no CUDA header, so
// every build (with or without nvcc) compiles against it. In a build without
// CUDA every call that needs a GPU returns UNAVAILABLE.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace hicache::cuda {

// True when this binary contains the compiled kernels.
bool CompiledWithCuda();

// Number of usable GPUs; 0 when there is no driver or device (never an error
// for "no GPU"). UNAVAILABLE only when CUDA was not compiled in.
absl::StatusOr<int> VisibleDeviceCount();

// A batched page copy: for every i in [0, num_pages),
//   copy bytes_per_page bytes
//   from src + src_pages[i] * src_stride_bytes
//   to   dst + dst_pages[i] * dst_stride_bytes.
// `src`/`dst` may be device or pinned host pointers the device can address;
// `src_pages`/`dst_pages` are device-accessible arrays of num_pages entries.
// Contract (checked, INVALID_ARGUMENT otherwise): bytes_per_page > 0 and a
// multiple of 4 (656-byte FP8 MLA rows included); strides multiples of 4 and
// >= bytes_per_page; src/dst 4-byte aligned; arrays non-null when
// num_pages > 0. Pages must not overlap between source and destination.
struct PageCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  const int64_t* src_pages = nullptr;
  const int64_t* dst_pages = nullptr;
  int64_t num_pages = 0;
  int64_t bytes_per_page = 0;
  int64_t src_stride_bytes = 0;
  int64_t dst_stride_bytes = 0;
};

// Validates `copy`, then enqueues the kernel on `stream` (a cudaStream_t, or
// nullptr for the default stream). Asynchronous: completion is observed with
// SynchronizeStream() or an event.
absl::Status ValidatePageCopy(const PageCopy& copy);
absl::Status LaunchPageCopy(const PageCopy& copy, void* stream);

// Minimal device-memory helpers (used by tests and the CUDA backend).
absl::StatusOr<void*> DeviceAlloc(size_t bytes);
absl::Status DeviceFree(void* ptr);
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes);
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes);
absl::Status SynchronizeStream(void* stream);

}  // namespace hicache::cuda
