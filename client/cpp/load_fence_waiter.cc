#include "client/cpp/load_fence_waiter.h"

namespace hicache::client {

absl::StatusOr<std::unique_ptr<LoadFenceWaiter>> LoadFenceWaiter::Create(
    int device) {
  return Create(device, CudaApi::Get());
}

absl::StatusOr<std::unique_ptr<LoadFenceWaiter>> LoadFenceWaiter::Create(
    int device, const absl::StatusOr<const CudaApi*>& cuda) {
  if (!cuda.ok()) return cuda.status();
  if (*cuda == nullptr) {
    return absl::InvalidArgumentError("LoadFenceWaiter: no CUDA runtime given");
  }
  if (device < 0) {
    return absl::InvalidArgumentError(
        "LoadFenceWaiter: device must be a CUDA device ordinal");
  }
  return std::unique_ptr<LoadFenceWaiter>(new LoadFenceWaiter(device, *cuda));
}

LoadFenceWaiter::~LoadFenceWaiter() {
  absl::MutexLock lock(&mu_);
  for (const auto& entry : events_) {
    // Destroying an event that the driver already lost cannot be helped
    // here; the waiter is going away either way.
    const CudaEvent event = entry.second;
    (void)cuda_->OnDevice(device_, [&] { return cuda_->EventDestroy(event); });
  }
}

absl::Status LoadFenceWaiter::Wait(absl::string_view fence, CudaStream stream) {
  if (fence.empty()) return absl::OkStatus();
  absl::StatusOr<CudaIpcHandle> handle = ToIpcHandle(fence, "load fence");
  if (!handle.ok()) return handle.status();
  absl::MutexLock lock(&mu_);
  auto it = events_.find(fence);
  if (it == events_.end()) {
    // The first wait on this fence opens its event (kept for later waits).
    CudaEvent opened{};
    absl::Status open = cuda_->OnDevice(device_, [&]() -> absl::Status {
      absl::StatusOr<CudaEvent> event = cuda_->IpcOpenEventHandle(*handle);
      if (!event.ok()) return event.status();
      opened = *event;
      return absl::OkStatus();
    });
    if (!open.ok()) return open;
    it = events_.emplace(std::string(fence), opened).first;
  }
  const CudaEvent event = it->second;
  return cuda_->OnDevice(device_, [&]() -> absl::Status {
    return cuda_->StreamWaitEvent(stream, event);
  });
}

}  // namespace hicache::client
