#pragma once

// Internal to //daemon/engine: the record of one backup or load.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/op_lifecycle.h"

namespace hicache {

struct HiCacheEngine::Op {
  using Kind = OpKind;
  Kind kind = Kind::kBackup;
  // Where it stands (op_lifecycle.h); moved only by AdvanceOpLocked.
  OpState state = OpState::kPrepared;
  uint64_t id = 0;
  std::vector<LogicalPage> pages;  // Logical device pages, position order.
  std::vector<Rank> owners;        // Lane of every page.
  int64_t logical_len = 0;
  std::vector<std::vector<int64_t>> host;  // Per rank, its pages in order.
  std::vector<bool> submitted;             // Per step: every served rank.
  // Backups stored rank by rank (workers' own layer_stored): per step, the
  // served ranks already submitted; empty until the first per-rank store.
  std::vector<std::vector<bool>> rank_submitted;
  int64_t acked = 0;                       // (rank, step) completions.
  int64_t outstanding = 0;                 // Submitted, not yet completed.
  int64_t submit_ns = 0;
  // For the observer (EngineObserver): when the op was made, and when each
  // step was last submitted (empty until a step is submitted one by one).
  int64_t start_ns = absl::GetCurrentTimeNanos();
  std::vector<int64_t> step_submit_ns;
  // Backup: the node it is attached to (kept after a failure, for the
  // record). Load: the node the caller gets.
  NodeId node = kNoNode;
  bool write_back = false;  // Backup of an eviction victim (write-back).
  // Load: the host-only chain and how many pages each node takes.
  std::vector<std::pair<NodeId, int64_t>> chain;
  NodeId locked_parent = kNoNode;  // Held while copies run.
  // kLoaded: `node` is locked for the caller until FinishLoad.
};

}  // namespace hicache
