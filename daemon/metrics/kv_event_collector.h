#pragma once

#include <functional>
#include <vector>

#include "daemon/events/kv_event_publisher.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace hicache::metrics {

// The KV-event publisher's counters (docs/kv-events.md, docs/metrics.md),
// read at scrape time from `stats` (the daemon passes
// KvEventPublisher::stats). Subscribers are not counted: a PUB socket does
// not know them.
//
// Thread-safe as `stats` is; it must outlive the collector.
class KvEventCollector final : public prometheus::Collectable {
 public:
  using StatsFn = std::function<events::KvEventPublisherStats()>;

  explicit KvEventCollector(StatsFn stats) : stats_(std::move(stats)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

  // The families of one snapshot (Collect without the call; for tests).
  static std::vector<prometheus::MetricFamily> Families(
      const events::KvEventPublisherStats& stats);

 private:
  const StatsFn stats_;
};

}  // namespace hicache::metrics
