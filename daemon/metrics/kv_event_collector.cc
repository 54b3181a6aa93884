#include "daemon/metrics/kv_event_collector.h"

#include "daemon/metrics/family_builder.h"

namespace hicache::metrics {

std::vector<prometheus::MetricFamily> KvEventCollector::Collect() const {
  return Families(stats_());
}

std::vector<prometheus::MetricFamily> KvEventCollector::Families(
    const events::KvEventPublisherStats& s) {
  FamilyBuilder f;
  f.Counter("hicache_kv_events_published_total",
            "KV events (BlockStored, BlockRemoved, AllBlocksCleared) sent on "
            "the PUB socket.")
      .Sample(static_cast<double>(s.events_published));
  f.Counter("hicache_kv_event_blocks_published_total",
            "Block hashes in the KV events sent.")
      .Sample(static_cast<double>(s.blocks_published));
  f.Counter("hicache_kv_event_batches_published_total",
            "KVEventBatch messages sent.")
      .Sample(static_cast<double>(s.batches_published));
  f.Counter("hicache_kv_events_dropped_total",
            "KV events dropped because the publisher's queue was full (each "
            "drop is repaired by a resync).")
      .Sample(static_cast<double>(s.events_dropped));
  f.Counter("hicache_kv_event_resyncs_total",
            "Clears and re-announcements of every tier after dropped events.")
      .Sample(static_cast<double>(s.resyncs));
  f.Counter("hicache_kv_event_replay_requests_total",
            "Replay requests answered on the ROUTER socket.")
      .Sample(static_cast<double>(s.replay_requests));
  f.Counter("hicache_kv_event_replay_batches_total",
            "Batches sent in replay answers.")
      .Sample(static_cast<double>(s.replay_batches));
  f.Counter("hicache_kv_event_replay_refused_total",
            "Malformed replay requests (not answered).")
      .Sample(static_cast<double>(s.replay_refused));
  f.Gauge("hicache_kv_events_queued", "KV events waiting to be sent.")
      .Sample(static_cast<double>(s.queued_events));
  return f.Take();
}

}  // namespace hicache::metrics
