// raw_api.h for builds without nvcc: every call reports kNotCompiled.
#include "cuda_kernels/raw_api.h"

namespace hicache::cuda::raw {

bool CompiledWithCuda() { return false; }
const char* RawErrorString(int /*code*/) {
  return "CUDA support was not compiled in";
}
int RawDeviceCount(int* count) {
  *count = 0;
  return kNotCompiled;
}
int RawLaunchPageCopy(const void*, void*, const int64_t*, const int64_t*,
                      int64_t, int64_t, int64_t, int64_t, void*) {
  return kNotCompiled;
}
int RawMalloc(void** ptr, size_t /*bytes*/) {
  *ptr = nullptr;
  return kNotCompiled;
}
int RawFree(void*) { return kNotCompiled; }
int RawCopy(void*, const void*, size_t, bool) { return kNotCompiled; }
int RawSynchronize(void*) { return kNotCompiled; }

}  // namespace hicache::cuda::raw
