#include "client/cpp/mapped_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/block_address.h"

namespace hicache::client {
namespace {

constexpr char kGpuAdvice[] =
    "; run the worker on the GPU node with CUDA installed";

// Prefixes a CUDA failure with what was being mapped; environment failures
// (FAILED_PRECONDITION) also say where the worker has to run.
absl::Status GpuPoolError(const v1::PoolSegment& segment,
                          const absl::Status& cause) {
  const bool environment =
      cause.code() == absl::StatusCode::kFailedPrecondition;
  const bool loaded = !absl::StartsWith(cause.message(), "libcudart");
  return absl::Status(
      cause.code(),
      absl::StrCat("this pool is GPU memory (cuda_ipc) and ",
                   loaded ? "a CUDA call failed: " : "", cause.message(),
                   " [pool '", segment.name(), "' on device ", segment.device(),
                   segment.pci_bus_id().empty()
                       ? ""
                       : absl::StrCat(", PCI ", segment.pci_bus_id()),
                   "]", environment ? kGpuAdvice : ""));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::Map(
    const v1::PoolSegment& segment) {
  if (segment.kind() != "cuda_ipc") return Map(segment, nullptr);
  return Map(segment, CudaApi::Get());
}

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::Map(
    const v1::PoolSegment& segment,
    const absl::StatusOr<const CudaApi*>& cuda) {
  if (segment.size_bytes() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", segment.name(), "' has size_bytes 0"));
  }
  if (segment.kind() == "shm") {
    const int fd = shm_open(segment.name().c_str(), O_RDWR, 0);
    if (fd < 0) {
      const int error = errno;
      const std::string message =
          absl::StrCat("shm_open ", segment.name(), ": ", std::strerror(error));
      return error == ENOENT ? absl::NotFoundError(message)
                             : absl::PermissionDeniedError(message);
    }
    void* data = mmap(nullptr, segment.size_bytes(), PROT_READ | PROT_WRITE,
                      MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);
    if (data == MAP_FAILED) {
      return absl::InternalError(
          absl::StrCat("mmap ", segment.name(), " (", segment.size_bytes(),
                       " bytes): ", std::strerror(error)));
    }
    return std::unique_ptr<MappedPool>(
        new MappedPool(Kind::kShm, static_cast<uint8_t*>(data),
                       segment.size_bytes(), segment.name(), -1, nullptr));
  }
  if (segment.kind() != "cuda_ipc") {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", segment.name(), "' has kind '", segment.kind(),
                     "'; this client maps 'shm' and 'cuda_ipc'"));
  }
  // The handle is checked before CUDA is needed: a malformed layout is the
  // same error on every machine.
  absl::StatusOr<CudaIpcHandle> handle =
      ToIpcHandle(segment.ipc_handle(), "ipc_handle");
  if (!handle.ok()) return handle.status();
  if (!cuda.ok()) return GpuPoolError(segment, cuda.status());
  if (*cuda == nullptr) {
    return GpuPoolError(segment, absl::FailedPreconditionError(
                                     "libcudart could not be loaded: none "
                                     "was given"));
  }
  const CudaApi& api = **cuda;
  absl::StatusOr<int> device =
      api.FindDevice(segment.pci_bus_id(), segment.device());
  if (!device.ok()) return GpuPoolError(segment, device.status());
  void* data = nullptr;
  absl::Status opened = api.OnDevice(*device, [&]() -> absl::Status {
    absl::StatusOr<void*> ptr = api.IpcOpenMemHandle(*handle);
    if (!ptr.ok()) return ptr.status();
    data = *ptr;
    return absl::OkStatus();
  });
  if (!opened.ok()) return GpuPoolError(segment, opened);
  return std::unique_ptr<MappedPool>(
      new MappedPool(Kind::kCudaIpc, static_cast<uint8_t*>(data),
                     segment.size_bytes(), segment.name(), *device, &api));
}

MappedPool::MappedPool(Kind kind, uint8_t* data, uint64_t size,
                       std::string name, int device, const CudaApi* cuda)
    : kind_(kind),
      data_(data),
      size_(size),
      name_(std::move(name)),
      device_(device),
      cuda_(cuda) {}

MappedPool::~MappedPool() {
  if (kind_ == Kind::kShm) {
    munmap(data_, size_);
    return;
  }
  // Best effort: nothing useful can be done with a failure here.
  (void)cuda_->OnDevice(device_,
                        [&] { return cuda_->IpcCloseMemHandle(data_); });
}

absl::StatusOr<uint8_t*> MappedPool::BlockData(const v1::BlockAddress& block,
                                               int64_t page) const {
  absl::StatusOr<uint64_t> offset = CheckedBlockOffset(block, page, size_);
  if (!offset.ok()) return offset.status();
  return data_ + *offset;
}

}  // namespace hicache::client
