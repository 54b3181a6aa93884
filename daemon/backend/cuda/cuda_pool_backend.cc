#include "daemon/backend/cuda/cuda_pool_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/pool/persistent_host_segment.h"
#include "daemon/pool/shm_pool.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// `status` with `context` in front of its message, same code.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

// One rank's device memory: a DeviceMalloc allocation exported by IPC handle.
class CudaDevicePool final : public KvPool {
 public:
  CudaDevicePool(cuda::CudaRuntime* runtime, std::string name, int device,
                 void* data, uint64_t size_bytes, std::string ipc_handle,
                 std::string pci_bus_id)
      : runtime_(runtime),
        name_(std::move(name)),
        device_(device),
        data_(data),
        size_bytes_(size_bytes),
        ipc_handle_(std::move(ipc_handle)),
        pci_bus_id_(std::move(pci_bus_id)) {}

  ~CudaDevicePool() override {
    if (absl::Status s = runtime_->DeviceFree(device_, data_); !s.ok()) {
      spdlog::error("freeing device pool {} ({} bytes on CUDA device {}): {}",
                    name_, size_bytes_, device_, s);
    }
  }

  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return size_bytes_; }
  void* host_data() const override { return nullptr; }
  void* backend_data() const override { return data_; }
  PoolExport Export() const override {
    return PoolExport{.kind = PoolExport::Kind::kCudaIpc,
                      .handle = ipc_handle_,
                      .size_bytes = size_bytes_,
                      .device = device_,
                      .pci_bus_id = pci_bus_id_};
  }

 private:
  cuda::CudaRuntime* const runtime_;
  const std::string name_;
  const int device_;
  void* const data_;
  const uint64_t size_bytes_;
  const std::string ipc_handle_;
  const std::string pci_bus_id_;
};

// One rank's host memory: a shared-memory segment, registered (pinned and
// device-mapped) with the runtime when `registered`.
class CudaHostPool final : public KvPool {
 public:
  CudaHostPool(cuda::CudaRuntime* runtime, std::unique_ptr<ShmPool> shm,
               bool registered, absl::Duration register_time)
      : runtime_(runtime),
        shm_(std::move(shm)),
        registered_(registered),
        pin_time_(register_time + shm_->pin_time()) {}

  // Unregisters before the ShmPool unmaps (and unlinks) the segment.
  ~CudaHostPool() override {
    if (!registered_) return;
    if (absl::Status s = runtime_->HostUnregister(shm_->host_data()); !s.ok()) {
      spdlog::error("unregistering host pool {} ({} bytes): {}", shm_->name(),
                    shm_->size_bytes(), s);
    }
  }

  const std::string& name() const override { return shm_->name(); }
  uint64_t size_bytes() const override { return shm_->size_bytes(); }
  void* host_data() const override { return shm_->host_data(); }
  void* backend_data() const override { return shm_->backend_data(); }
  PoolExport Export() const override { return shm_->Export(); }
  bool pinned() const override { return registered_ || shm_->pinned(); }
  absl::Duration pin_time() const override { return pin_time_; }

 private:
  cuda::CudaRuntime* const runtime_;
  const std::unique_ptr<ShmPool> shm_;
  const bool registered_;
  const absl::Duration pin_time_;
};

}  // namespace

CudaPoolBackend::CudaPoolBackend(cuda::CudaRuntime* runtime,
                                 std::vector<int> device_of_rank,
                                 std::string shm_prefix, bool pin_host_memory)
    : runtime_(runtime),
      device_of_rank_(std::move(device_of_rank)),
      shm_prefix_(std::move(shm_prefix)),
      pin_host_memory_(pin_host_memory) {}

absl::StatusOr<int> CudaPoolBackend::DeviceOf(Rank rank) const {
  if (rank >= device_of_rank_.size() || device_of_rank_[rank] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " has no CUDA device in the rank-to-device map (",
        device_of_rank_.size(), " ranks mapped)"));
  }
  return device_of_rank_[rank];
}

absl::StatusOr<std::unique_ptr<KvPool>> CudaPoolBackend::CreateDevicePool(
    Rank rank, uint64_t size_bytes) {
  absl::StatusOr<int> device = DeviceOf(rank);
  if (!device.ok()) return device.status();
  const std::string what =
      absl::StrCat("device pool of rank ", rank, " (", size_bytes,
                   " bytes on CUDA device ", *device, ")");
  if (size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a pool must have a positive size"));
  }
  absl::StatusOr<cuda::DeviceInfo> info = runtime_->GetDeviceInfo(*device);
  if (!info.ok()) return Annotate(info.status(), what + ": GetDeviceInfo");
  absl::StatusOr<void*> data = runtime_->DeviceMalloc(*device, size_bytes);
  if (!data.ok()) return Annotate(data.status(), what + ": DeviceMalloc");
  // From here on, free the allocation on every error path.
  auto fail = [&](const absl::Status& status, absl::string_view call) {
    if (absl::Status s = runtime_->DeviceFree(*device, *data); !s.ok()) {
      spdlog::error("{}: DeviceFree after a failed {}: {}", what, call, s);
    }
    return Annotate(status, absl::StrCat(what, ": ", call));
  };
  // Zeroed, so that a page read before it is ever written is deterministic.
  if (absl::Status s = runtime_->Memset(*data, 0, size_bytes); !s.ok()) {
    return fail(s, "Memset");
  }
  absl::StatusOr<std::string> handle = runtime_->IpcGetMemHandle(*data);
  if (!handle.ok()) return fail(handle.status(), "IpcGetMemHandle");
  if (handle->size() != cuda::kIpcHandleBytes) {
    return fail(absl::InternalError(absl::StrCat("handle of ", handle->size(),
                                                 " bytes, expected ",
                                                 cuda::kIpcHandleBytes)),
                "IpcGetMemHandle");
  }
  spdlog::info("{}: allocated on {} ({})", what, info->name, info->pci_bus_id);
  return std::unique_ptr<KvPool>(new CudaDevicePool(
      runtime_, absl::StrCat(shm_prefix_, "-device-r", rank), *device, *data,
      size_bytes, *std::move(handle), info->pci_bus_id));
}

absl::StatusOr<std::unique_ptr<KvPool>> CudaPoolBackend::CreateHostPool(
    Rank rank, uint64_t size_bytes, bool lock_memory) {
  absl::StatusOr<int> device = DeviceOf(rank);
  if (!device.ok()) return device.status();
  const std::string what =
      absl::StrCat("host pool of rank ", rank, " (", size_bytes,
                   " bytes for CUDA device ", *device, ")");
  absl::StatusOr<std::unique_ptr<ShmPool>> shm = ShmPool::Create(
      absl::StrCat(shm_prefix_, "-host-r", rank), size_bytes, lock_memory);
  if (!shm.ok()) return Annotate(shm.status(), what + ": ShmPool::Create");
  return PinHostPool(what, *std::move(shm));
}

absl::StatusOr<std::unique_ptr<KvPool>>
CudaPoolBackend::CreatePersistentHostPool(Rank rank, uint64_t size_bytes,
                                          bool lock_memory,
                                          uint64_t fingerprint,
                                          bool* attached) {
  absl::StatusOr<int> device = DeviceOf(rank);
  if (!device.ok()) return device.status();
  const std::string what =
      absl::StrCat("persistent host pool of rank ", rank, " (", size_bytes,
                   " bytes for CUDA device ", *device, ")");
  absl::StatusOr<PersistentHostSegment> segment = OpenPersistentHostSegment(
      shm_prefix_, rank, size_bytes, lock_memory, fingerprint);
  if (!segment.ok()) {
    return Annotate(segment.status(), what + ": OpenPersistentHostSegment");
  }
  *attached = segment->attached;
  return PinHostPool(what, std::move(segment->pool));
}

absl::StatusOr<std::unique_ptr<KvPool>> CudaPoolBackend::PinHostPool(
    const std::string& what, std::unique_ptr<ShmPool> shm) {
  const uint64_t size_bytes = shm->size_bytes();
  absl::Duration register_time;
  if (pin_host_memory_) {
    const absl::Time start = absl::Now();
    if (absl::Status s = runtime_->HostRegister(shm->host_data(), size_bytes);
        !s.ok()) {
      return Annotate(s, what + ": HostRegister");  // shm unmaps it.
    }
    register_time = absl::Now() - start;
  }
  spdlog::info(
      "{}: shared memory {}, {}", what, shm->name(),
      pin_host_memory_
          ? absl::StrCat("pinned in ", absl::FormatDuration(register_time))
          : std::string("not pinned"));
  return std::unique_ptr<KvPool>(new CudaHostPool(
      runtime_, std::move(shm), pin_host_memory_, register_time));
}

}  // namespace hicache
