#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/daemon_config.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/storage/page_store.h"

namespace hicache {

// The storage tier's stores for `config.storage` (docs/storage-tier.md):
// one FilePageStore per CP rank, files "rank<r>" in storage.dir (created
// 0700), of the geometry's page size; or one RedisPageStore that every rank
// shares (storage.redis_address). Empty without either. The caller gives
// rank r stores[r], or stores[0] to every rank when there is one.
absl::StatusOr<std::vector<std::unique_ptr<PageStore>>> OpenStorageStores(
    const DaemonConfig& config, const KvGeometry& geometry);

}  // namespace hicache
