#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "client/cpp/cuda_api.h"
#include "client/cpp/mapped_pool.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::client {

// The device (L1) and host (L2) pools of one CP rank, mapped into this
// process from a GetLayoutResponse, with the layout's block addresses, so a
// worker can find every (family, layer, page) block of its rank:
//
//   auto layout = session->GetLayout();
//   auto pools = PoolMapping::Map(*layout, rank);
//   uint8_t* k = *(*pools)->DeviceBlock(family, layer, physical_page);
//
// Works for both backends: "shm" pools (CPU backend; CUDA host pools) are
// host memory, "cuda_ipc" pools are device memory (see MappedPool).
// Immutable; thread-safe.
class PoolMapping {
 public:
  // Maps the pools of `rank` (the RankSegments entry with that rank).
  // NOT_FOUND when the daemon does not serve `rank`; otherwise the first
  // error of MappedPool::Map (device pool first). Nothing stays mapped on
  // error.
  static absl::StatusOr<std::unique_ptr<PoolMapping>> Map(
      const v1::GetLayoutResponse& layout, uint32_t rank);
  // The same with the CUDA runtime given (see MappedPool::Map).
  static absl::StatusOr<std::unique_ptr<PoolMapping>> Map(
      const v1::GetLayoutResponse& layout, uint32_t rank,
      const absl::StatusOr<const CudaApi*>& cuda);

  uint32_t rank() const { return rank_; }
  // The mapped pools; nullptr where the layout names no such pool.
  const MappedPool* device() const { return device_.get(); }
  const MappedPool* host() const { return host_.get(); }

  // Where physical page `page` of block (family, layer) starts in the device
  // / host pool (a device pointer for a cuda_ipc pool). NOT_FOUND for an
  // unknown block or an absent pool; OUT_OF_RANGE for a page not below the
  // geometry's device_pages_per_rank / host_pages_per_rank or a block
  // outside the pool.
  absl::StatusOr<uint8_t*> DeviceBlock(uint32_t family, uint32_t layer,
                                       int64_t page) const;
  absl::StatusOr<uint8_t*> HostBlock(uint32_t family, uint32_t layer,
                                     int64_t page) const;

 private:
  PoolMapping(uint32_t rank, std::unique_ptr<MappedPool> device,
              std::unique_ptr<MappedPool> host,
              const v1::GetLayoutResponse& layout);

  const uint32_t rank_;
  const std::unique_ptr<MappedPool> device_;
  const std::unique_ptr<MappedPool> host_;
  const uint64_t device_pages_;
  const uint64_t host_pages_;
  const google::protobuf::RepeatedPtrField<v1::BlockAddress> device_blocks_;
  const google::protobuf::RepeatedPtrField<v1::BlockAddress> host_blocks_;
};

}  // namespace hicache::client
