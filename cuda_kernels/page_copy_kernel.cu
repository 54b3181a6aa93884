// CUDA implementation of raw_api.h: the batched page-copy kernel and thin
// runtime wrappers. Compiled by nvcc for sm_90a plus PTX.

#include <cuda_runtime.h>

#include <cstdint>

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
  return static_cast<int>(
      cudaMemcpy(dst, src, bytes,
                 to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
}

int RawSynchronize(void* stream) {
  return static_cast<int>(
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

}  // namespace raw
}  // namespace hicache::cuda
