#pragma once

#include <cstdint>

#include "absl/time/time.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

// One layer (step) copy of a backup or load that completed, for metrics.
struct LayerCopyEvent {
  enum class Kind { kBackup, kLoad };
  Kind kind = Kind::kBackup;
  bool write_back = false;  // A backup of an eviction victim.
  Rank rank = 0;
  uint32_t step = 0;       // 0 .. num_steps - 1 (target layers, then draft).
  uint32_t num_steps = 0;  // Steps of every op of this engine.
  bool ok = true;          // The copy succeeded.
  uint64_t bytes = 0;
  // From the op's start (a load: LoadBack; a backup: PrepareBackups, or the
  // write-through/write-back start) to this copy's completion. For a load
  // every step is submitted at the start, so this is how long the model
  // waited for the layer; for a scheduler's backup it includes the forward
  // pass up to the layer.
  absl::Duration since_start;
  // From the step's submission (a load: its start; a backup: the
  // layer_stored that submitted it -- the latest one for rank-by-rank
  // stores) to its completion: the copy time, queueing included.
  absl::Duration since_submit;
};

// Receives the engine's per-layer timings (injected through
// EngineOptions::observer). Called from transfer completion threads after
// the engine's lock is released, one call per (op, rank, step) completion;
// implementations must be thread-safe, fast and must not call back into the
// engine. The engine does not own the observer, which must outlive it.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnLayerCopy(const LayerCopyEvent& event) = 0;
};

}  // namespace hicache
