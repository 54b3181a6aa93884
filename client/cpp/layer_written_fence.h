#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cpp/cuda_api.h"

namespace hicache::client {

// A worker's "layer written" fence for the CUDA backend: an interprocess
// CUDA event the worker records on its compute stream after writing a
// layer's KV, and the daemon's copy stream waits on before backing it up.
//
//   auto fence = LayerWrittenFence::Create(pools->device()->device());
//   RegisterFence(session, rank, (*fence)->handle()) -> fence_id   (once)
//   per layer: (*fence)->Record(stream); then layer_stored naming
//              RankFence{rank, fence_id}
//
// The daemon waits on the latest record as of when it handles the
// layer_stored, so Record must come before sending it. ReleaseFence (or
// closing the session) before destroying this object. Thread-compatible:
// Record() may be called from several threads, in an order they agree on.
class LayerWrittenFence {
 public:
  // Creates the event on `device` (an ordinal in this process's numbering).
  // FAILED_PRECONDITION without libcudart or a usable GPU; CUDA errors name
  // the failed call.
  static absl::StatusOr<std::unique_ptr<LayerWrittenFence>> Create(int device);
  // The same with the CUDA runtime given; `cuda` must outlive the fence.
  static absl::StatusOr<std::unique_ptr<LayerWrittenFence>> Create(
      int device, const absl::StatusOr<const CudaApi*>& cuda);

  ~LayerWrittenFence();  // cudaEventDestroy.
  LayerWrittenFence(const LayerWrittenFence&) = delete;
  LayerWrittenFence& operator=(const LayerWrittenFence&) = delete;

  // The cudaIpcEventHandle_t bytes (64), for RegisterFenceRequest.event_handle.
  const std::string& handle() const { return handle_; }
  int device() const { return device_; }

  // cudaEventRecord on `stream` (a cudaStream_t of `device`).
  absl::Status Record(CudaStream stream) const;

 private:
  LayerWrittenFence(int device, const CudaApi* cuda, CudaEvent event,
                    std::string handle)
      : device_(device),
        cuda_(cuda),
        event_(event),
        handle_(std::move(handle)) {}

  const int device_;
  const CudaApi* const cuda_;
  const CudaEvent event_;
  const std::string handle_;
};

}  // namespace hicache::client
