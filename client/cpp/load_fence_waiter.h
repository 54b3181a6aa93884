#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/cuda_api.h"

namespace hicache::client {

// Makes a worker's CUDA stream wait on the daemon's load fences: the
// LoadBackEvent.LayerLoaded.fence bytes (a cudaIpcEventHandle_t recorded
// after the layer landed in the device pool), so compute reading the layer
// is ordered after the copy without a host sync:
//
//   auto waiter = LoadFenceWaiter::Create(pools->device()->device());
//   for each LayerLoaded event:
//     (*waiter)->Wait(event.layer_loaded().fence(), compute_stream);
//
// Each distinct handle is opened once (cudaIpcOpenEventHandle) and kept
// until destruction; the daemon reuses a small set of events, so the cache
// stays small. Thread-safe.
class LoadFenceWaiter {
 public:
  // `device`: the ordinal, in this process, of the GPU the fences are opened
  // on (the device pool's MappedPool::device()). Loads libcudart
  // (FAILED_PRECONDITION "libcudart could not be loaded: ..." without it).
  static absl::StatusOr<std::unique_ptr<LoadFenceWaiter>> Create(int device);
  // The same with the CUDA runtime given; `cuda` must outlive the waiter.
  static absl::StatusOr<std::unique_ptr<LoadFenceWaiter>> Create(
      int device, const absl::StatusOr<const CudaApi*>& cuda);

  // Destroys the opened events (the daemon's own events live on).
  ~LoadFenceWaiter();
  LoadFenceWaiter(const LoadFenceWaiter&) = delete;
  LoadFenceWaiter& operator=(const LoadFenceWaiter&) = delete;

  // Orders all later work of `stream` (a cudaStream_t; nullptr is the
  // default stream) after the fence's latest record. An empty `fence` (a
  // backend without events) is OK and does nothing. INVALID_ARGUMENT when
  // `fence` is not 64 bytes; CUDA errors name the failed call.
  absl::Status Wait(absl::string_view fence, CudaStream stream)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LoadFenceWaiter(int device, const CudaApi* cuda)
      : device_(device), cuda_(cuda) {}

  const int device_;
  const CudaApi* const cuda_;
  absl::Mutex mu_;
  // Handle bytes -> the event opened from them.
  absl::flat_hash_map<std::string, CudaEvent> events_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::client
