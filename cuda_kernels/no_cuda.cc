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

RawErrorClass RawClassifyError(int /*code*/) { return kRawOtherError; }
int RawGetDeviceProps(int, RawDeviceProps*) { return kNotCompiled; }
int RawSetDevice(int) { return kNotCompiled; }
int RawPointerDevice(const void*, int* device) {
  *device = -1;
  return kNotCompiled;
}
int RawMallocOnDevice(int, void** ptr, size_t) {
  *ptr = nullptr;
  return kNotCompiled;
}
int RawMemset(void*, int, size_t) { return kNotCompiled; }
int RawMemcpy(void*, const void*, size_t) { return kNotCompiled; }
int RawIpcGetMemHandle(void*, void*) { return kNotCompiled; }
int RawIpcOpenMemHandle(int, const void*, void** ptr) {
  *ptr = nullptr;
  return kNotCompiled;
}
int RawIpcCloseMemHandle(void*) { return kNotCompiled; }
int RawHostRegister(void*, size_t) { return kNotCompiled; }
int RawHostUnregister(void*) { return kNotCompiled; }
int RawHostAlloc(void** ptr, size_t) {
  *ptr = nullptr;
  return kNotCompiled;
}
int RawFreeHost(void*) { return kNotCompiled; }
int RawStreamCreate(int, void** stream) {
  *stream = nullptr;
  return kNotCompiled;
}
int RawStreamDestroy(void*) { return kNotCompiled; }
int RawEventCreate(int, bool, bool, void** event) {
  *event = nullptr;
  return kNotCompiled;
}
int RawEventDestroy(void*) { return kNotCompiled; }
int RawEventRecord(void*, void*) { return kNotCompiled; }
int RawEventQuery(void*, bool* complete) {
  *complete = false;
  return kNotCompiled;
}
int RawEventSynchronize(void*) { return kNotCompiled; }
int RawEventElapsedMs(void*, void*, float* ms) {
  *ms = 0;
  return kNotCompiled;
}
int RawIpcGetEventHandle(void*, void*) { return kNotCompiled; }
int RawIpcOpenEventHandle(int, const void*, void** event) {
  *event = nullptr;
  return kNotCompiled;
}
int RawStreamWaitEvent(void*, void*) { return kNotCompiled; }
int RawMemcpyAsync(void*, const void*, size_t, void*) { return kNotCompiled; }
int RawLaunchBatchedPageCopy(const void*, void*, const void*, int32_t, int64_t,
                             int32_t, void*) {
  return kNotCompiled;
}
int RawMemcpyBatchAsync(void* const*, const void* const*, const size_t*, size_t,
                        void*) {
  return kNotCompiled;
}

}  // namespace hicache::cuda::raw
