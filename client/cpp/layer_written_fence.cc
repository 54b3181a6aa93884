#include "client/cpp/layer_written_fence.h"

#include <utility>

namespace hicache::client {

absl::StatusOr<std::unique_ptr<LayerWrittenFence>> LayerWrittenFence::Create(
    int device) {
  return Create(device, CudaApi::Get());
}

absl::StatusOr<std::unique_ptr<LayerWrittenFence>> LayerWrittenFence::Create(
    int device, const absl::StatusOr<const CudaApi*>& cuda) {
  if (!cuda.ok()) return cuda.status();
  if (*cuda == nullptr) {
    return absl::InvalidArgumentError(
        "LayerWrittenFence: no CUDA runtime given");
  }
  if (device < 0) {
    return absl::InvalidArgumentError(
        "LayerWrittenFence: device must be a CUDA device ordinal");
  }
  const CudaApi& api = **cuda;
  CudaEvent event = nullptr;
  std::string handle;
  absl::Status created = api.OnDevice(device, [&]() -> absl::Status {
    absl::StatusOr<CudaEvent> made = api.CreateInterprocessEvent();
    if (!made.ok()) return made.status();
    absl::StatusOr<CudaIpcHandle> exported = api.IpcGetEventHandle(*made);
    if (!exported.ok()) {
      (void)api.EventDestroy(*made);
      return exported.status();
    }
    event = *made;
    handle.assign(exported->bytes, kCudaIpcHandleBytes);
    return absl::OkStatus();
  });
  if (!created.ok()) return created;
  return std::unique_ptr<LayerWrittenFence>(
      new LayerWrittenFence(device, &api, event, std::move(handle)));
}

LayerWrittenFence::~LayerWrittenFence() {
  (void)cuda_->OnDevice(device_, [&] { return cuda_->EventDestroy(event_); });
}

absl::Status LayerWrittenFence::Record(CudaStream stream) const {
  return cuda_->OnDevice(device_,
                         [&] { return cuda_->EventRecord(event_, stream); });
}

}  // namespace hicache::client
