#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

// What a transfer task is checked against: the pools of one side (a local
// engine's, a CP follower's, or what the leader knows of a follower's).
// Each bound is checked only where it is set.
struct TransferTaskBounds {
  // Put before every message, to say whose pools these are
  // ("follower 1 at 10.0.0.2:7070: "). Empty: none.
  std::string context;
  // Whether `rank` may be named (this side has its pools). Unset: any rank.
  std::function<bool(Rank)> serves;
  // Steps [0, num_steps) exist (KvGeometry::NumSteps()).
  std::optional<uint32_t> num_steps;
  // Device pages [0, n) and host pages [0, n) exist on each rank. A
  // negative page is refused whether or not these are set.
  std::optional<int64_t> device_pages_per_rank;
  std::optional<int64_t> host_pages_per_rank;
  // A copy naming a fence (RankCopy::wait_fence) is refused.
  bool refuse_fences = false;
  // A rank named by two copies of one task is refused (the second copy).
  bool refuse_repeated_ranks = false;
};

// Checks `task` against `bounds` before it is queued: its step, then each
// rank copy in order (CheckRankCopy). OK, or INVALID_ARGUMENT with
// `bounds.context` then the first problem found:
//   "step 9 is outside the geometry's 8"
//   "rank 5 is not served"
//   "rank 2 is named twice"
//   "rank 2: fence 3 named where no fences are accepted"
//   "rank 2: 2 device pages but 1 host pages"
//   "rank 2: page pair 1 (device 16, host 1) is outside the pools (16
//    device, 32 host pages a rank)"
// A task with no ranks is checked for its step only. Checks of a caller's
// own (fences it registered, copy streams, frame sizes) come after.
absl::Status CheckTransferTask(const TransferTaskBounds& bounds,
                               const TransferTask& task);

// The same checks for the copy at `index` of `task` alone, for a caller that
// refuses copy by copy and runs the others (a CP follower): the task's step,
// then that copy (with refuse_repeated_ranks, a rank that a copy before
// `index` names is refused). Requires index < task.ranks.size().
absl::Status CheckRankCopy(const TransferTaskBounds& bounds,
                           const TransferTask& task, size_t index);

// The bounds of this daemon's `pools` (which must outlive them): a rank with
// both a device and a host pool, the geometry's steps, the pools' sizes. No
// context; fences and repeated ranks are the engine's business.
TransferTaskBounds TransferTaskBoundsOf(const RankPools& pools);

// CheckTransferTask(TransferTaskBoundsOf(pools), task): the checks every
// local transfer engine makes. Fences are the engine's own business (a
// backend without events refuses them; one with events checks their
// registration).
absl::Status CheckTransferTask(const RankPools& pools,
                               const TransferTask& task);

}  // namespace hicache
