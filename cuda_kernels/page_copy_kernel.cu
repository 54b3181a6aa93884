// CUDA implementation of raw_api.h: the batched page-copy kernel and thin
// runtime wrappers. Compiled by nvcc for sm_90a plus PTX.

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda_kernels/raw_api.h"

namespace hicache::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int64_t kMaxBlocks = 65535;

// One block per page (grid-stride over pages); threads stride over the page's
// words of type Word. REQUIRES: bytes_per_page, both strides and both base
// pointers are multiples of sizeof(Word).
template <typename Word>
__global__ void PageCopyKernel(const char* __restrict__ src,
                               char* __restrict__ dst,
                               const int64_t* __restrict__ src_pages,
                               const int64_t* __restrict__ dst_pages,
                               int64_t num_pages, int64_t words_per_page,
                               int64_t src_stride_bytes,
                               int64_t dst_stride_bytes) {
  for (int64_t page = blockIdx.x; page < num_pages; page += gridDim.x) {
    const Word* from =
        reinterpret_cast<const Word*>(src + src_pages[page] * src_stride_bytes);
    Word* to =
        reinterpret_cast<Word*>(dst + dst_pages[page] * dst_stride_bytes);
    for (int64_t w = threadIdx.x; w < words_per_page; w += blockDim.x) {
      to[w] = from[w];
    }
  }
}

bool Aligned(const void* ptr, int64_t value, int64_t alignment) {
  return reinterpret_cast<uintptr_t>(ptr) % alignment == 0 &&
         value % alignment == 0;
}

// One region of a batched copy, laid out like hicache::cuda::CopyRegion
// (daemon/backend/cuda/cuda_runtime.h), which this file cannot include.
struct RegionRecord {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes_per_page;
  uint64_t src_stride;
  uint64_t dst_stride;
};
static_assert(sizeof(RegionRecord) == 40, "must match CopyRegion");

template <typename Word>
__device__ void CopyWords(const char* from, char* to, uint64_t bytes) {
  const Word* src = reinterpret_cast<const Word*>(from);
  Word* dst = reinterpret_cast<Word*>(to);
  const uint64_t words = bytes / sizeof(Word);
  for (uint64_t w = threadIdx.x; w < words; w += blockDim.x) dst[w] = src[w];
}

// Grid-stride over the (region, page pair) items, region-major so that
// neighbouring blocks copy neighbouring pages of one region. Each block
// copies one item: thread 0 reads its descriptors (often pinned host memory,
// so once per item, not once per thread) into shared memory; the block then
// copies with 16-byte words when both addresses and the size allow it (the
// 656-byte FP8 and 1152-byte bf16 rows at aligned offsets), else with
// 4-byte words (132-byte indexer rows, odd strides or offsets).
__global__ void BatchedPageCopyKernel(const char* src_base, char* dst_base,
                                      const RegionRecord* __restrict__ regions,
                                      const int64_t* __restrict__ src_pages,
                                      const int64_t* __restrict__ dst_pages,
                                      int32_t num_regions, int64_t num_pages) {
  __shared__ const char* item_from;
  __shared__ char* item_to;
  __shared__ uint64_t item_bytes;
  const int64_t items = static_cast<int64_t>(num_regions) * num_pages;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    if (threadIdx.x == 0) {
      const int64_t r = item / num_pages;
      const int64_t i = item - r * num_pages;
      const RegionRecord region = regions[r];
      item_from = src_base + region.src_offset +
                  src_pages[i] * static_cast<int64_t>(region.src_stride);
      item_to = dst_base + region.dst_offset +
                dst_pages[i] * static_cast<int64_t>(region.dst_stride);
      item_bytes = region.bytes_per_page;
    }
    __syncthreads();
    const char* from = item_from;
    char* to = item_to;
    const uint64_t bytes = item_bytes;
    __syncthreads();  // Everyone has read them before thread 0 moves on.
    if (((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to) |
          bytes) &
         15) == 0) {
      CopyWords<uint4>(from, to, bytes);
    } else {
      CopyWords<uint32_t>(from, to, bytes);
    }
  }
}

}  // namespace

namespace raw {

bool CompiledWithCuda() { return true; }

const char* RawErrorString(int code) {
  if (code == kNotCompiled) return "CUDA support was not compiled in";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int RawDeviceCount(int* count) {
  const cudaError_t err = cudaGetDeviceCount(count);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
      err == cudaErrorInitializationError) {
    cudaGetLastError();  // Clear the sticky error.
    *count = 0;
    return 0;
  }
  return static_cast<int>(err);
}

int RawLaunchPageCopy(const void* src, void* dst, const int64_t* src_pages,
                      const int64_t* dst_pages, int64_t num_pages,
                      int64_t bytes_per_page, int64_t src_stride_bytes,
                      int64_t dst_stride_bytes, void* stream) {
  if (num_pages == 0) return 0;
  const dim3 grid(
      static_cast<unsigned>(num_pages < kMaxBlocks ? num_pages : kMaxBlocks));
  const dim3 block(kThreadsPerBlock);
  auto* s = static_cast<cudaStream_t>(stream);
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  // 16-byte words when everything allows it (1152-byte bf16 and 656-byte FP8
  // rows do), else 4-byte words (132-byte indexer rows).
  const bool wide = Aligned(src, src_stride_bytes, 16) &&
                    Aligned(dst, dst_stride_bytes, 16) &&
                    bytes_per_page % 16 == 0;
  // cudaGetLastError after the launch must report this launch only, not a
  // (non-sticky) error an earlier runtime call left on this thread.
  (void)cudaGetLastError();
  if (wide) {
    PageCopyKernel<uint4><<<grid, block, 0, s>>>(
        from, to, src_pages, dst_pages, num_pages, bytes_per_page / 16,
        src_stride_bytes, dst_stride_bytes);
  } else {
    PageCopyKernel<uint32_t><<<grid, block, 0, s>>>(
        from, to, src_pages, dst_pages, num_pages, bytes_per_page / 4,
        src_stride_bytes, dst_stride_bytes);
  }
  return static_cast<int>(cudaGetLastError());
}

int RawMalloc(void** ptr, size_t bytes) {
  return static_cast<int>(cudaMalloc(ptr, bytes));
}

int RawFree(void* ptr) { return static_cast<int>(cudaFree(ptr)); }

int RawCopy(void* dst, const void* src, size_t bytes, bool to_device) {
  const cudaError_t err =
      cudaMemcpy(dst, src, bytes,
                 to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return static_cast<int>(err);
  // cudaMemcpy from pageable memory may return before the DMA has landed.
  return static_cast<int>(cudaStreamSynchronize(cudaStreamLegacy));
}

int RawSynchronize(void* stream) {
  return static_cast<int>(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

// --- For RealCudaRuntime -----------------------------------------------------

namespace {

int Code(cudaError_t err) { return static_cast<int>(err); }
cudaStream_t AsStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}
cudaEvent_t AsEvent(void* event) { return static_cast<cudaEvent_t>(event); }

}  // namespace

RawErrorClass RawClassifyError(int code) {
  switch (static_cast<cudaError_t>(code)) {
    case cudaErrorMemoryAllocation:
      return kRawOutOfMemory;
    case cudaErrorHostMemoryAlreadyRegistered:
      return kRawAlreadyRegistered;
    case cudaErrorHostMemoryNotRegistered:
      return kRawNotRegistered;
    case cudaErrorNotReady:
      return kRawNotReady;
    case cudaErrorNotSupported:
      return kRawNotSupported;
    default:
      return kRawOtherError;
  }
}

int RawGetDeviceProps(int device, RawDeviceProps* props) {
  cudaDeviceProp prop;
  if (cudaError_t err = cudaGetDeviceProperties(&prop, device);
      err != cudaSuccess) {
    return Code(err);
  }
  static_assert(sizeof(props->name) >= sizeof(prop.name), "name too short");
  memcpy(props->name, prop.name, sizeof(prop.name));
  props->name[sizeof(props->name) - 1] = '\0';
  if (cudaError_t err = cudaDeviceGetPCIBusId(
          props->pci_bus_id, sizeof(props->pci_bus_id), device);
      err != cudaSuccess) {
    return Code(err);
  }
  props->multiprocessors = prop.multiProcessorCount;
  props->major = prop.major;
  props->minor = prop.minor;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Code(err);
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes);
      err != cudaSuccess) {
    return Code(err);
  }
  props->free_bytes = free_bytes;
  props->total_bytes = total_bytes;
  return 0;
}

int RawSetDevice(int device) { return Code(cudaSetDevice(device)); }

int RawPointerDevice(const void* ptr, int* device) {
  cudaPointerAttributes attributes;
  const cudaError_t err = cudaPointerGetAttributes(&attributes, ptr);
  if (err != cudaSuccess) {
    *device = -1;
    return Code(err);
  }
  *device = (attributes.type == cudaMemoryTypeDevice ||
             attributes.type == cudaMemoryTypeManaged)
                ? attributes.device
                : -1;
  return 0;
}

int RawMallocOnDevice(int device, void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Code(err);
  }
  return Code(cudaMalloc(ptr, bytes));
}

// cudaMemset on device memory, and cudaMemcpy from pageable host memory,
// may return before the work is done; the work runs on the legacy stream,
// which our non-blocking streams (and other processes) are not ordered
// after. Both wait for it, so that they are synchronous as raw_api.h says.
int RawMemset(void* ptr, int value, size_t bytes) {
  if (cudaError_t err = cudaMemset(ptr, value, bytes); err != cudaSuccess) {
    return Code(err);
  }
  return Code(cudaStreamSynchronize(cudaStreamLegacy));
}

int RawMemcpy(void* dst, const void* src, size_t bytes) {
  if (cudaError_t err = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
      err != cudaSuccess) {
    return Code(err);
  }
  return Code(cudaStreamSynchronize(cudaStreamLegacy));
}

int RawIpcGetMemHandle(void* handle64, void* ptr) {
  static_assert(sizeof(cudaIpcMemHandle_t) == kRawIpcHandleBytes, "size");
  cudaIpcMemHandle_t handle;
  if (cudaError_t err = cudaIpcGetMemHandle(&handle, ptr); err != cudaSuccess) {
    return Code(err);
  }
  memcpy(handle64, &handle, sizeof(handle));
  return 0;
}

int RawIpcOpenMemHandle(int device, const void* handle64, void** ptr) {
  *ptr = nullptr;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Code(err);
  }
  cudaIpcMemHandle_t handle;
  memcpy(&handle, handle64, sizeof(handle));
  return Code(
      cudaIpcOpenMemHandle(ptr, handle, cudaIpcMemLazyEnablePeerAccess));
}

int RawIpcCloseMemHandle(void* ptr) { return Code(cudaIpcCloseMemHandle(ptr)); }

int RawHostRegister(void* ptr, size_t bytes) {
  if (cudaError_t err = cudaHostRegister(
          ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
      err != cudaSuccess) {
    return Code(err);
  }
  // The kernels address registered memory at its host address; that holds
  // only where every device has cudaDevAttrCanUseHostPointerForRegisteredMem
  // (cudaHostRegister's documentation). Refuse the registration otherwise.
  void* device_ptr = nullptr;
  cudaError_t err = cudaHostGetDevicePointer(&device_ptr, ptr, 0);
  if (err == cudaSuccess && device_ptr != ptr) err = cudaErrorNotSupported;
  if (err != cudaSuccess) {
    cudaHostUnregister(ptr);
    cudaGetLastError();
    return Code(err);
  }
  return 0;
}

int RawHostUnregister(void* ptr) { return Code(cudaHostUnregister(ptr)); }

int RawHostAlloc(void** ptr, size_t bytes) {
  *ptr = nullptr;
  return Code(
      cudaHostAlloc(ptr, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
}

int RawFreeHost(void* ptr) { return Code(cudaFreeHost(ptr)); }

int RawStreamCreate(int device, void** stream) {
  *stream = nullptr;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Code(err);
  }
  cudaStream_t created = nullptr;
  const cudaError_t err =
      cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking);
  *stream = created;
  return Code(err);
}

int RawStreamDestroy(void* stream) {
  return Code(cudaStreamDestroy(AsStream(stream)));
}

int RawEventCreate(int device, bool timing, bool interprocess, void** event) {
  *event = nullptr;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Code(err);
  }
  unsigned flags = cudaEventDefault;
  // Untimed events are waited on by completion threads (one per stream):
  // block in the driver instead of spinning a core per stream.
  if (!timing) flags |= cudaEventDisableTiming | cudaEventBlockingSync;
  if (interprocess) flags |= cudaEventInterprocess;
  cudaEvent_t created = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&created, flags);
  *event = created;
  return Code(err);
}

int RawEventDestroy(void* event) {
  return Code(cudaEventDestroy(AsEvent(event)));
}

int RawEventRecord(void* event, void* stream) {
  return Code(cudaEventRecord(AsEvent(event), AsStream(stream)));
}

int RawEventQuery(void* event, bool* complete) {
  const cudaError_t err = cudaEventQuery(AsEvent(event));
  *complete = err == cudaSuccess;
  return err == cudaErrorNotReady ? 0 : Code(err);
}

int RawEventSynchronize(void* event) {
  return Code(cudaEventSynchronize(AsEvent(event)));
}

int RawEventElapsedMs(void* start, void* end, float* ms) {
  *ms = 0;
  return Code(cudaEventElapsedTime(ms, AsEvent(start), AsEvent(end)));
}

int RawIpcGetEventHandle(void* handle64, void* event) {
  static_assert(sizeof(cudaIpcEventHandle_t) == kRawIpcHandleBytes, "size");
  cudaIpcEventHandle_t handle;
  if (cudaError_t err = cudaIpcGetEventHandle(&handle, AsEvent(event));
      err != cudaSuccess) {
    return Code(err);
  }
  memcpy(handle64, &handle, sizeof(handle));
  return 0;
}

int RawIpcOpenEventHandle(int device, const void* handle64, void** event) {
  *event = nullptr;
  if (cudaError_t err = cudaSetDevice(device); err != cudaSuccess) {
    return Code(err);
  }
  cudaIpcEventHandle_t handle;
  memcpy(&handle, handle64, sizeof(handle));
  cudaEvent_t opened = nullptr;
  const cudaError_t err = cudaIpcOpenEventHandle(&opened, handle);
  *event = opened;
  return Code(err);
}

int RawStreamWaitEvent(void* stream, void* event) {
  return Code(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0));
}

int RawMemcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  return Code(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, AsStream(stream)));
}

int RawLaunchBatchedPageCopy(const void* src_base, void* dst_base,
                             const void* descriptors, int32_t num_regions,
                             int64_t num_pages, int32_t max_blocks,
                             void* stream) {
  if (num_regions <= 0 || num_pages <= 0) return 0;
  const int64_t items = static_cast<int64_t>(num_regions) * num_pages;
  int64_t blocks = items < kMaxBlocks ? items : kMaxBlocks;
  if (max_blocks > 0 && blocks > max_blocks) blocks = max_blocks;
  const auto* regions = static_cast<const RegionRecord*>(descriptors);
  const auto* src_pages =
      reinterpret_cast<const int64_t*>(regions + num_regions);
  const int64_t* dst_pages = src_pages + num_pages;
  // As in RawLaunchPageCopy: the error checked below is this launch's own.
  // (A caller that sees a launch fail recycles the descriptors at once, so a
  // stale error reported for a launch that did happen would be a race.)
  (void)cudaGetLastError();
  BatchedPageCopyKernel<<<dim3(static_cast<unsigned>(blocks)),
                          dim3(kThreadsPerBlock), 0, AsStream(stream)>>>(
      static_cast<const char*>(src_base), static_cast<char*>(dst_base), regions,
      src_pages, dst_pages, num_regions, num_pages);
  return Code(cudaGetLastError());
}

int RawMemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                        const size_t* sizes, size_t count, void* stream) {
  if (count == 0) return 0;
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attributes;
  memset(&attributes, 0, sizeof(attributes));
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attribute_index = 0;
#if CUDART_VERSION >= 13000
  return Code(cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attributes,
                                   &attribute_index, 1, AsStream(stream)));
#else
  size_t fail_index = 0;
  return Code(
      cudaMemcpyBatchAsync(const_cast<void**>(dsts), const_cast<void**>(srcs),
                           const_cast<size_t*>(sizes), count, &attributes,
                           &attribute_index, 1, &fail_index, AsStream(stream)));
#endif
#else
  return Code(cudaErrorNotSupported);
#endif
}

}  // namespace raw
}  // namespace hicache::cuda
