#pragma once

#include "absl/status/status.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

// The checks every transfer engine makes before it queues `task` over
// `pools`: the step is inside the geometry, every rank has a device and a
// host pool here, page lists pair up, and every page is inside its pool.
// INVALID_ARGUMENT naming the first bad field. Fences are the engine's own
// business (a backend without events refuses them; one with events checks
// their registration).
absl::Status CheckTransferTask(const RankPools& pools,
                               const TransferTask& task);

}  // namespace hicache
