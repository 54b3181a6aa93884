#pragma once

#include <cstddef>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace hicache::metrics {

// The cache's state, read at scrape time from what the engine and the
// session manager already count (no counter is duplicated): hit tokens per
// tier, backups, loads, evictions and transfers, pool occupancy per lane and
// rank, the tree, sessions and streams per role, and usage of the largest
// namespaces (the rest summed as namespace="__other__"; see TopNamespaces).
// docs/metrics.md lists every series.
//
// Collect() takes the engine's and the manager's locks briefly, and walks
// the tree once (O(nodes)) for the namespace series. Thread-safe; `engine`
// and `sessions` must outlive it (or at least every Collect()).
class CacheCollector final : public prometheus::Collectable {
 public:
  static constexpr size_t kDefaultMaxNamespaces = 20;

  CacheCollector(const HiCacheEngine* engine, const SessionManager* sessions,
                 size_t max_namespaces = kDefaultMaxNamespaces)
      : engine_(engine), sessions_(sessions), max_namespaces_(max_namespaces) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const HiCacheEngine* const engine_;
  const SessionManager* const sessions_;
  const size_t max_namespaces_;
};

}  // namespace hicache::metrics
