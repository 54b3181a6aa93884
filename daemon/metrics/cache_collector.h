#pragma once

#include <cstddef>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
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
// Collect() takes the engine's and the manager's locks briefly. The
// namespace series need a walk of the whole tree under the engine's lock
// (O(nodes)); so that whoever can reach the endpoint cannot stall the engine
// by scraping in a loop, that walk runs at most once per
// `namespace_interval` and scrapes in between reuse its result. Thread-safe;
// `engine` and `sessions` must outlive it (or at least every Collect()).
class CacheCollector final : public prometheus::Collectable {
 public:
  static constexpr size_t kDefaultMaxNamespaces = 20;
  static constexpr absl::Duration kDefaultNamespaceInterval = absl::Seconds(1);

  CacheCollector(const HiCacheEngine* engine, const SessionManager* sessions,
                 size_t max_namespaces = kDefaultMaxNamespaces,
                 absl::Duration namespace_interval = kDefaultNamespaceInterval)
      : engine_(engine),
        sessions_(sessions),
        max_namespaces_(max_namespaces),
        namespace_interval_(namespace_interval) {}

  std::vector<prometheus::MetricFamily> Collect() const override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The tree's per-namespace usage, walked at most once per interval.
  std::vector<NamespaceUsage> UsageByNamespace() const ABSL_LOCKS_EXCLUDED(mu_);

  const HiCacheEngine* const engine_;
  const SessionManager* const sessions_;
  const size_t max_namespaces_;
  const absl::Duration namespace_interval_;
  mutable Mutex mu_;
  mutable absl::Time usage_time_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable std::vector<NamespaceUsage> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::metrics
