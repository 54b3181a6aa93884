#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

// A device backend: where the pools live and what moves bytes between them.
// The engine is given one (EngineOptions::backend) and never learns which:
// the CPU backend (daemon/backend/cpu) backs both tiers with shared memory
// and copies with memcpy; the CUDA backend (daemon/backend/cuda) owns GPU
// memory and pinned host memory and copies with its own kernel and streams.
//
// Thread-safe. Outlives every pool and transfer engine it made.
class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda" (plus the runtime, e.g. "cuda (simulated)").
  virtual std::string name() const = 0;
  // Whether copies can wait on worker events (fences) and loads report
  // "layer landed" events: true for the CUDA backend.
  virtual bool has_events() const { return false; }
  // Creates the pools of every served rank (RankPools::Create calls it).
  virtual PoolBackend& pools() = 0;
  // Checks, before any memory is taken, that pools of these sizes fit what
  // the machine has (GPU free memory, /dev/shm space); FAILED_PRECONDITION
  // naming the resource, the need and what is available otherwise.
  virtual absl::Status CheckCapacity(const RankPools::Sizes& sizes) = 0;
  // The transfer engine over `pools` (made by pools()), reporting to
  // `listener`. Both must outlive it.
  virtual std::unique_ptr<TransferEngine> CreateTransferEngine(
      const RankPools* pools, TransferListener* listener) = 0;
};

}  // namespace hicache
