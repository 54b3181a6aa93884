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

// --- For RealCudaRuntime (daemon/backend/cuda) -------------------------------
// Handles (streams, events) are passed as void*; IPC handles as 64 bytes.
// Calls that act on a stream, event or pointer of a device other than the
// current one need RawSetDevice first (the current device is per thread).

inline constexpr size_t kRawIpcHandleBytes = 64;

struct RawDeviceProps {
  char name[256];
  char pci_bus_id[32];
  uint64_t total_bytes;
  uint64_t free_bytes;
  int multiprocessors;
  int major;
  int minor;
};

// What a code means, where callers map it to a status code.
enum RawErrorClass : int {
  kRawOtherError = 0,
  kRawOutOfMemory = 1,        // cudaErrorMemoryAllocation
  kRawAlreadyRegistered = 2,  // cudaErrorHostMemoryAlreadyRegistered
  kRawNotRegistered = 3,      // cudaErrorHostMemoryNotRegistered
  kRawNotReady = 4,           // cudaErrorNotReady
  kRawNotSupported = 5,       // cudaErrorNotSupported
};
RawErrorClass RawClassifyError(int code);

int RawGetDeviceProps(int device, RawDeviceProps* props);
int RawSetDevice(int device);
// The device of device memory (or IPC-mapped memory); -1 for host memory
// (registered, pinned or not known to CUDA).
int RawPointerDevice(const void* ptr, int* device);

int RawMallocOnDevice(int device, void** ptr, size_t bytes);
int RawMemset(void* ptr, int value, size_t bytes);
// cudaMemcpy with cudaMemcpyDefault, then a sync of the legacy stream (so
// synchronous also from pageable memory; RawMemset too).
int RawMemcpy(void* dst, const void* src, size_t bytes);
int RawIpcGetMemHandle(void* handle64, void* ptr);
int RawIpcOpenMemHandle(int device, const void* handle64, void** ptr);
int RawIpcCloseMemHandle(void* ptr);
// cudaHostRegisterPortable | cudaHostRegisterMapped; cudaErrorNotSupported
// (nothing left registered) where the device would not address the memory
// at `ptr` (cudaHostGetDevicePointer differs).
int RawHostRegister(void* ptr, size_t bytes);
int RawHostUnregister(void* ptr);
// cudaHostAllocPortable | cudaHostAllocMapped.
int RawHostAlloc(void** ptr, size_t bytes);
int RawFreeHost(void* ptr);

// A non-blocking stream on `device`.
int RawStreamCreate(int device, void** stream);
int RawStreamDestroy(void* stream);
int RawEventCreate(int device, bool timing, bool interprocess, void** event);
int RawEventDestroy(void* event);
int RawEventRecord(void* event, void* stream);
// *complete = false for cudaErrorNotReady (returned as success).
int RawEventQuery(void* event, bool* complete);
int RawEventSynchronize(void* event);
int RawEventElapsedMs(void* start, void* end, float* ms);
int RawIpcGetEventHandle(void* handle64, void* event);
int RawIpcOpenEventHandle(int device, const void* handle64, void** event);
int RawStreamWaitEvent(void* stream, void* event);
// cudaMemcpyAsync with cudaMemcpyDefault.
int RawMemcpyAsync(void* dst, const void* src, size_t bytes, void* stream);

// The batched gather/scatter kernel (daemon/backend/cuda/cuda_runtime.h,
// BatchedPageCopy): for every region x page pair, bytes_per_page bytes.
// `descriptors` (device-accessible) holds the regions (40-byte records
// laid out like hicache::cuda::CopyRegion), then the source and destination
// page indices (int64). max_blocks 0: the default grid. Nothing is checked
// here: the caller validates (ValidateRegions).
int RawLaunchBatchedPageCopy(const void* src_base, void* dst_base,
                             const void* descriptors, int32_t num_regions,
                             int64_t num_pages, int32_t max_blocks,
                             void* stream);
// cudaMemcpyBatchAsync (CUDA 12.8+), sources read in stream order;
// cudaErrorNotSupported where the toolkit is older.
int RawMemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                        const size_t* sizes, size_t count, void* stream);

}  // namespace hicache::cuda::raw
