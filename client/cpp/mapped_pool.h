#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/cuda_api.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::client {

// One daemon pool (a rank's device or host pool) mapped into this process:
//   * kind "shm": shm_open(name) + mmap of size_bytes, read-write shared; the
//     bytes are host memory (the CPU backend's pools, CUDA host pools).
//   * kind "cuda_ipc": cudaIpcOpenMemHandle(ipc_handle) on the GPU that
//     pci_bus_id names (else ordinal `device`); data() is a *device* pointer
//     for kernels and cudaMemcpy, never to be dereferenced on the host.
// Unmapped (munmap / cudaIpcCloseMemHandle) on destruction. Immutable;
// thread-safe. The daemon owns the memory: a mapping outliving the daemon's
// pool keeps shm bytes alive but means nothing.
class MappedPool {
 public:
  enum class Kind { kShm, kCudaIpc };

  // Maps `segment`, loading libcudart (CudaApi::Get) only for "cuda_ipc".
  // Errors:
  //   INVALID_ARGUMENT: unknown kind, size 0, an ipc_handle not 64 bytes.
  //   NOT_FOUND: no shm segment of that name.
  //   FAILED_PRECONDITION: a cuda_ipc pool where libcudart cannot be loaded
  //     or no GPU is usable ("this pool is GPU memory (cuda_ipc) and ...; run
  //     the worker on the GPU node with CUDA installed").
  //   Others as CudaApi::Error maps them, the message naming the CUDA call.
  static absl::StatusOr<std::unique_ptr<MappedPool>> Map(
      const v1::PoolSegment& segment);
  // The same with the CUDA runtime (or why it is absent) given: tests, or a
  // caller with its own libcudart, which must outlive the mapping. Not
  // consulted for "shm".
  static absl::StatusOr<std::unique_ptr<MappedPool>> Map(
      const v1::PoolSegment& segment,
      const absl::StatusOr<const CudaApi*>& cuda);

  ~MappedPool();
  MappedPool(const MappedPool&) = delete;
  MappedPool& operator=(const MappedPool&) = delete;

  Kind kind() const { return kind_; }
  // Host pointer (kShm) or device pointer (kCudaIpc) to byte 0 of the pool.
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The segment's name (shm name, or the daemon's label for a GPU pool).
  const std::string& name() const { return name_; }
  // kCudaIpc: the device ordinal, in this process's numbering, the pool was
  // opened on (make it current for kernels on data()); -1 for kShm.
  int device() const { return device_; }

  // data() + CheckedBlockOffset(block, page, size()): OUT_OF_RANGE when the
  // block does not lie inside the pool. The pool's page count is not known
  // here: PoolMapping's lookups also check the page against it.
  absl::StatusOr<uint8_t*> BlockData(const v1::BlockAddress& block,
                                     int64_t page) const;

 private:
  MappedPool(Kind kind, uint8_t* data, uint64_t size, std::string name,
             int device, const CudaApi* cuda);

  const Kind kind_;
  uint8_t* const data_;
  const uint64_t size_;
  const std::string name_;
  const int device_;
  const CudaApi* const cuda_;  // kCudaIpc only; outlives the mapping.
};

}  // namespace hicache::client
