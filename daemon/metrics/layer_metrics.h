#pragma once

#include <vector>

#include "daemon/engine/engine_observer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hicache::metrics {

// The engine's per-layer timings (EngineObserver), labelled by op =
// "load" | "backup" (a scheduler's or a write-through backup) |
// "write_back" (a backup of an eviction victim):
//   hicache_layer_copy_seconds{op}          histogram: each (rank, layer)
//       copy, from its submission to its completion (queueing included)
//   hicache_layer_ready_seconds{op,layer}   histogram, layer = "first" |
//       "last": from the op's start to the completion of its first / last
//       layer (step 0 / step num_steps - 1), per rank. For loads this is what
//       a model waits for before it can run its first / last layer.
// Failed copies are not timed (hicache_copy_failures_total counts them).
//
// Thread-safe; the registry must outlive it.
class LayerMetrics final : public EngineObserver {
 public:
  explicit LayerMetrics(prometheus::Registry& registry);

  // Buckets in seconds (10 us .. 30 s).
  static const std::vector<double>& Buckets();

  void OnLayerCopy(const LayerCopyEvent& event) override;

 private:
  static constexpr int kOps = 3;  // load, backup, write_back.
  prometheus::Histogram* copy_[kOps];
  prometheus::Histogram* first_[kOps];
  prometheus::Histogram* last_[kOps];
};

}  // namespace hicache::metrics
