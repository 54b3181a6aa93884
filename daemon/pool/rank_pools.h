#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/daemon_config.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/kv_pool.h"

namespace hicache {

// Sizes of the pools of every served rank.
struct RankPoolsOptions {
  int64_t device_pages_per_rank = 0;  // Including the reserved page 0.
  int64_t host_pages_per_rank = 0;
  HostLayout host_layout = HostLayout::kLayerFirst;
  bool lock_host_memory = false;
  // Hot restart: non-zero makes the host pools outlive the daemon, named
  // after this fingerprint (PoolBackend::CreatePersistentHostPool).
  uint64_t persistent_host_fingerprint = 0;
};

// The device and host pool of each rank this daemon serves, with the geometry
// that addresses them. Immutable after Create(); thread-safe.
class RankPools {
 public:
  // What Create will ask the backend for.
  struct Sizes {
    std::vector<Rank> ranks;  // Served ranks, ascending.
    uint64_t device_bytes_per_rank = 0;
    uint64_t host_bytes_per_rank = 0;  // 0: no host tier.
  };
  static Sizes SizesFor(const CpLayout& layout, const KvGeometry& geometry,
                        const RankPoolsOptions& options);

  // Creates one device and (if host_pages_per_rank > 0) one host pool per
  // served rank through `backend`. All or nothing: on error nothing remains.
  static absl::StatusOr<std::unique_ptr<RankPools>> Create(
      const CpLayout& layout, const KvGeometry& geometry,
      const RankPoolsOptions& options, PoolBackend& backend);

  const CpLayout& layout() const { return layout_; }
  const KvGeometry& geometry() const { return geometry_; }
  const RankPoolsOptions& options() const { return options_; }

  // nullptr for a rank this daemon does not serve (or no host tier).
  KvPool* device(Rank rank) const;
  KvPool* host(Rank rank) const;
  // Persistent host pools: whether every served rank's host pool was
  // attached with a previous daemon's bytes (false when not persistent).
  bool host_attached() const { return host_attached_; }

 private:
  RankPools(const CpLayout& layout, const KvGeometry& geometry,
            const RankPoolsOptions& options);

  CpLayout layout_;
  KvGeometry geometry_;
  RankPoolsOptions options_;
  std::vector<std::unique_ptr<KvPool>> device_;  // Indexed by rank.
  std::vector<std::unique_ptr<KvPool>> host_;
  bool host_attached_ = false;
};

}  // namespace hicache
