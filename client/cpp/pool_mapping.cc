#include "client/cpp/pool_mapping.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/block_address.h"

namespace hicache::client {
namespace {

// Maps `segment` when the layout names one (a segment without a kind is
// absent), else leaves `out` null.
absl::Status MapIfPresent(bool present, const v1::PoolSegment& segment,
                          const absl::StatusOr<const CudaApi*>* cuda,
                          std::unique_ptr<MappedPool>* out) {
  if (!present || segment.kind().empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<MappedPool>> pool =
      cuda != nullptr ? MappedPool::Map(segment, *cuda)
                      : MappedPool::Map(segment);
  if (!pool.ok()) return pool.status();
  *out = *std::move(pool);
  return absl::OkStatus();
}

struct MappedRank {
  std::unique_ptr<MappedPool> device;
  std::unique_ptr<MappedPool> host;
};

absl::StatusOr<MappedRank> MapRank(const v1::GetLayoutResponse& layout,
                                   uint32_t rank,
                                   const absl::StatusOr<const CudaApi*>* cuda) {
  const v1::RankSegments* segments = nullptr;
  for (const v1::RankSegments& r : layout.ranks()) {
    if (r.rank() == rank) segments = &r;
  }
  if (segments == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("the daemon serves no pools of rank ", rank));
  }
  MappedRank mapped;
  if (absl::Status s = MapIfPresent(segments->has_device(), segments->device(),
                                    cuda, &mapped.device);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = MapIfPresent(segments->has_host(), segments->host(),
                                    cuda, &mapped.host);
      !s.ok()) {
    return s;
  }
  return mapped;
}

absl::StatusOr<uint8_t*> Block(
    const MappedPool* pool,
    const google::protobuf::RepeatedPtrField<v1::BlockAddress>& blocks,
    uint64_t num_pages, const char* tier, uint32_t family, uint32_t layer,
    int64_t page) {
  if (pool == nullptr) {
    return absl::NotFoundError(absl::StrCat("no ", tier, " pool is mapped"));
  }
  if (page < 0 || static_cast<uint64_t>(page) >= num_pages) {
    return absl::OutOfRangeError(
        absl::StrCat("page ", page, " is not a ", tier, " page (", tier,
                     "_pages_per_rank ", num_pages, ")"));
  }
  absl::StatusOr<const v1::BlockAddress*> block =
      FindBlock(blocks, family, layer);
  if (!block.ok()) return block.status();
  return pool->BlockData(**block, page);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PoolMapping>> PoolMapping::Map(
    const v1::GetLayoutResponse& layout, uint32_t rank) {
  absl::StatusOr<MappedRank> mapped = MapRank(layout, rank, nullptr);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<PoolMapping>(new PoolMapping(
      rank, std::move(mapped->device), std::move(mapped->host), layout));
}

absl::StatusOr<std::unique_ptr<PoolMapping>> PoolMapping::Map(
    const v1::GetLayoutResponse& layout, uint32_t rank,
    const absl::StatusOr<const CudaApi*>& cuda) {
  absl::StatusOr<MappedRank> mapped = MapRank(layout, rank, &cuda);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<PoolMapping>(new PoolMapping(
      rank, std::move(mapped->device), std::move(mapped->host), layout));
}

PoolMapping::PoolMapping(uint32_t rank, std::unique_ptr<MappedPool> device,
                         std::unique_ptr<MappedPool> host,
                         const v1::GetLayoutResponse& layout)
    : rank_(rank),
      device_(std::move(device)),
      host_(std::move(host)),
      device_pages_(layout.geometry().device_pages_per_rank()),
      host_pages_(layout.geometry().host_pages_per_rank()),
      device_blocks_(layout.device_blocks()),
      host_blocks_(layout.host_blocks()) {}

absl::StatusOr<uint8_t*> PoolMapping::DeviceBlock(uint32_t family,
                                                  uint32_t layer,
                                                  int64_t page) const {
  return Block(device_.get(), device_blocks_, device_pages_, "device", family,
               layer, page);
}

absl::StatusOr<uint8_t*> PoolMapping::HostBlock(uint32_t family, uint32_t layer,
                                                int64_t page) const {
  return Block(host_.get(), host_blocks_, host_pages_, "host", family, layer,
               page);
}

}  // namespace hicache::client
