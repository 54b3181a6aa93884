#include "daemon/pool/rank_pools.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {

absl::StatusOr<std::unique_ptr<RankPools>> RankPools::Create(
    const CpLayout& layout, const KvGeometry& geometry,
    const RankPoolsOptions& options, PoolBackend& backend) {
  if (geometry.page_size() != layout.page_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV geometry page size ", geometry.page_size(),
                     " differs from the layout's ", layout.page_size()));
  }
  if (options.device_pages_per_rank < 2 || options.host_pages_per_rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need at least 2 device pages per rank and no negative host pages, "
        "got ",
        options.device_pages_per_rank, " and ", options.host_pages_per_rank));
  }
  std::unique_ptr<RankPools> pools(new RankPools(layout, geometry, options));
  const bool persistent = options.persistent_host_fingerprint != 0 &&
                          options.host_pages_per_rank > 0;
  pools->host_attached_ = persistent;
  for (Rank rank : layout.served_ranks()) {
    auto device = backend.CreateDevicePool(
        rank, geometry.PoolBytes(options.device_pages_per_rank));
    if (!device.ok()) return device.status();
    pools->device_[rank] = *std::move(device);
    if (options.host_pages_per_rank == 0) continue;
    absl::StatusOr<std::unique_ptr<KvPool>> host;
    if (persistent) {
      bool attached = false;
      host = backend.CreatePersistentHostPool(
          rank, geometry.PoolBytes(options.host_pages_per_rank),
          options.lock_host_memory, options.persistent_host_fingerprint,
          &attached);
      pools->host_attached_ = pools->host_attached_ && attached;
    } else {
      host = backend.CreateHostPool(
          rank, geometry.PoolBytes(options.host_pages_per_rank),
          options.lock_host_memory);
    }
    if (!host.ok()) return host.status();
    pools->host_[rank] = *std::move(host);
  }
  return pools;
}

RankPools::Sizes RankPools::SizesFor(const CpLayout& layout,
                                     const KvGeometry& geometry,
                                     const RankPoolsOptions& options) {
  return Sizes{
      .ranks = layout.served_ranks(),
      .device_bytes_per_rank = geometry.PoolBytes(options.device_pages_per_rank),
      .host_bytes_per_rank = geometry.PoolBytes(options.host_pages_per_rank)};
}

RankPools::RankPools(const CpLayout& layout, const KvGeometry& geometry,
                     const RankPoolsOptions& options)
    : layout_(layout),
      geometry_(geometry),
      options_(options),
      device_(layout.cp_size()),
      host_(layout.cp_size()) {}

KvPool* RankPools::device(Rank rank) const {
  return rank < device_.size() ? device_[rank].get() : nullptr;
}

KvPool* RankPools::host(Rank rank) const {
  return rank < host_.size() ? host_[rank].get() : nullptr;
}

}  // namespace hicache
