#pragma once

// Which CUDA runtime the CUDA backend tests run on. By default they run on
// SimCudaRuntime (CPU); with HICACHE_CUDA_RUNTIME=real (tools/gpu_check and
// the GPU bundle's runner set it) the tests that can run on a GPU use
// RealCudaRuntime and skip when no GPU is visible, and the tests that need
// the simulator's fault injection or timing control skip.

#include <cstdlib>
#include <string_view>

namespace hicache::testing {

inline bool RealCudaRuntimeRequested() {
  const char* env = std::getenv("HICACHE_CUDA_RUNTIME");
  return env != nullptr && std::string_view(env) == "real";
}

}  // namespace hicache::testing
