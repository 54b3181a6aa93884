#pragma once

// Internal boundary between the C++ launcher (page_copy.cc, built by the host
// compiler) and its backend: page_copy_kernel.cu (nvcc) or no_cuda.cc. Plain
// types only, so neither side sees the other's headers.
//
// Every function returns 0 on success or a CUDA error code; RawErrorString()
// names it. RawDeviceCount() reports "no device / no driver" as 0 devices.

#include <cstddef>
#include <cstdint>

namespace hicache::cuda::raw {

inline constexpr int kNotCompiled = -1;  // Returned by every no_cuda.cc call.

bool CompiledWithCuda();
const char* RawErrorString(int code);
int RawDeviceCount(int* count);
int RawLaunchPageCopy(const void* src, void* dst, const int64_t* src_pages,
                      const int64_t* dst_pages, int64_t num_pages,
                      int64_t bytes_per_page, int64_t src_stride_bytes,
                      int64_t dst_stride_bytes, void* stream);
int RawMalloc(void** ptr, size_t bytes);
int RawFree(void* ptr);
int RawCopy(void* dst, const void* src, size_t bytes, bool to_device);
int RawSynchronize(void* stream);

}  // namespace hicache::cuda::raw
