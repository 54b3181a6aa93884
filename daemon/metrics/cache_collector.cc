#include "daemon/metrics/cache_collector.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/build_info.h"
#include "daemon/metrics/family_builder.h"
#include "daemon/metrics/label_values.h"

namespace hicache::metrics {
namespace {

using prometheus::MetricFamily;


void AddEngine(const EngineStats& s, FamilyBuilder& f) {
  f.Counter("hicache_match_calls_total", "Counted prefix matches.")
      .Sample(s.match_calls);
  f.Counter("hicache_query_tokens_total", "Tokens of the counted matches.")
      .Sample(s.query_tokens);
  const int64_t miss = std::max<int64_t>(
      0, s.query_tokens - s.device_hit_tokens - s.host_hit_tokens);
  f.Counter("hicache_hit_tokens_total",
            "Matched tokens by where they were found: device (L1), host (L2, "
            "loadable) or miss.")
      .Sample(s.device_hit_tokens, {{"tier", "device"}})
      .Sample(s.host_hit_tokens, {{"tier", "host"}})
      .Sample(miss, {{"tier", "miss"}});

  f.Counter("hicache_backups_started_total",
            "Device-to-host backups started (scheduler, write-through and "
            "write-back).")
      .Sample(s.backups_started);
  f.Counter("hicache_backups_committed_total",
            "Backups whose host copy became visible.")
      .Sample(s.backups_committed);
  f.Counter("hicache_backups_rolled_back_total", "Backups abandoned.")
      .Sample(s.backups_rolled_back);
  f.Counter("hicache_backups_skipped_total",
            "Backups not started: no host room even after host eviction.")
      .Sample(s.backups_skipped_no_host);
  f.Counter("hicache_backups_failed_total",
            "Backups ended by a failed copy (never committed).")
      .Sample(s.backups_failed);
  f.Counter("hicache_write_back_backups_total",
            "Backups of device eviction victims (write-back).")
      .Sample(s.write_back_backups);
  f.Counter("hicache_write_back_rejected_total",
            "Write-back victims refused by host admission (dropped).")
      .Sample(s.write_back_rejected);
  f.Counter("hicache_copy_waits_total",
            "Allocations and loads that waited for a write-back copy.")
      .Sample(s.copy_waits);
  f.Counter("hicache_write_ahead_backups_total",
            "Backups of the cold end of the device tier (write_ahead).")
      .Sample(s.write_ahead_backups);
  f.Counter("hicache_fallback_backups_total",
            "All-layer backups after the forward pass (no per-layer store).")
      .Sample(s.fallback_backups);

  f.Counter("hicache_loads_started_total", "Host-to-device loads started.")
      .Sample(s.loads_started);
  f.Counter("hicache_loads_done_total", "Loads whose every layer landed.")
      .Sample(s.loads_done);
  f.Counter("hicache_load_misses_total",
            "Host hits not loaded (below threshold, over quota, no device "
            "memory, load in flight).")
      .Sample(s.load_misses);
  f.Counter("hicache_loads_failed_total",
            "Loads ended by a failed copy (a miss for the client).")
      .Sample(s.loads_failed);
  f.Counter("hicache_copy_failures_total",
            "Failed layer copies (any direction).")
      .Sample(s.copy_failures);
  f.Counter("hicache_transfer_bytes_total",
            "Bytes copied between the tiers (completed copies).")
      .Sample(static_cast<double>(s.bytes_to_host), {{"direction", "to_host"}})
      .Sample(static_cast<double>(s.bytes_to_device),
              {{"direction", "to_device"}});
  f.Counter("hicache_layer_copies_total",
            "Completed (rank, layer) copies.")
      .Sample(s.steps_completed);

  f.Counter("hicache_evicted_pages_total", "Pages evicted, by tier.")
      .Sample(s.device_evicted_pages, {{"tier", "device"}})
      .Sample(s.host_evicted_pages, {{"tier", "host"}});
  f.Counter("hicache_eviction_steps_total", "Eviction passes, by tier.")
      .Sample(s.device_eviction_steps, {{"tier", "device"}})
      .Sample(s.host_eviction_steps, {{"tier", "host"}});
  f.Counter("hicache_device_victims_total",
            "Device eviction victims: moved to the host tier or removed.")
      .Sample(s.device_victims_to_host, {{"outcome", "to_host"}})
      .Sample(s.device_victims_removed, {{"outcome", "removed"}});
  f.Counter("hicache_host_copies_dropped_total",
            "Redundant host copies of device nodes dropped for host room.")
      .Sample(s.host_copies_dropped);
  f.Counter("hicache_device_alloc_failures_total",
            "Device allocations refused (RESOURCE_EXHAUSTED).")
      .Sample(s.device_alloc_failures);
  f.Counter("hicache_quota_refusals_total",
            "Allocations and loads refused by a namespace's device limit.")
      .Sample(s.quota_refusals);
  f.Counter("hicache_backups_skipped_quota_total",
            "Backups not started: over the namespace's host limit.")
      .Sample(s.backups_skipped_quota);
  f.Counter("hicache_quota_evicted_pages_total",
            "Pages evicted to keep namespaces under their limits.")
      .Sample(s.quota_evicted_pages);
}

// Namespaces with a quota: the quota and what each holds against it.
void AddQuotas(const std::vector<NamespaceQuotaUsage>& usage,
               FamilyBuilder& f) {
  std::vector<const NamespaceQuotaUsage*> with_quota;
  for (const NamespaceQuotaUsage& u : usage) {
    if (!u.quota.empty()) with_quota.push_back(&u);
  }
  f.Gauge("hicache_namespace_quota_pages",
          "A namespace's quota (docs/quotas.md), in logical pages; 0 = none.");
  for (const NamespaceQuotaUsage* u : with_quota) {
    const NamespaceQuota& q = u->quota;
    f.Sample(q.device_limit,
             {{"tenant", q.ns}, {"tier", "device"}, {"kind", "limit"}})
        .Sample(q.device_guaranteed,
                {{"tenant", q.ns}, {"tier", "device"}, {"kind", "guaranteed"}})
        .Sample(q.host_limit,
                {{"tenant", q.ns}, {"tier", "host"}, {"kind", "limit"}})
        .Sample(q.host_guaranteed,
                {{"tenant", q.ns}, {"tier", "host"}, {"kind", "guaranteed"}});
  }
  f.Gauge("hicache_namespace_quota_used_pages",
          "What a namespace with a quota holds against it: device (cached and "
          "requests) and host pages.");
  for (const NamespaceQuotaUsage* u : with_quota) {
    f.Sample(u->device_cached_pages + u->device_request_pages,
             {{"tenant", u->quota.ns}, {"tier", "device"}})
        .Sample(u->host_pages, {{"tenant", u->quota.ns}, {"tier", "host"}});
  }
}

void AddPools(const HiCacheEngine& engine, FamilyBuilder& f) {
  const uint32_t lanes = engine.layout().cp_size();
  FamilyBuilder& device = f.Gauge(
      "hicache_device_pages",
      "Device (L1) pages per lane: used (allocated: tree, requests, loads) "
      "or free (the reserved page 0 excluded).");
  for (Rank lane = 0; lane < lanes; ++lane) {
    const LaneCounts counts = engine.LaneCountsOf(lane);
    const std::string label = absl::StrCat(lane);
    device.Sample(counts.allocated, {{"lane", label}, {"state", "used"}});
    device.Sample(counts.available(), {{"lane", label}, {"state", "free"}});
  }
  FamilyBuilder& host = f.Gauge("hicache_host_pages",
                           "Host (L2) pages per rank: used or free.");
  const int64_t capacity = engine.options().host_pages_per_rank;
  for (Rank rank = 0; rank < lanes; ++rank) {
    const int64_t used = engine.HostUsedPages(rank);
    const std::string label = absl::StrCat(rank);
    host.Sample(used, {{"rank", label}, {"state", "used"}});
    host.Sample(capacity - used, {{"rank", label}, {"state", "free"}});
  }
  f.Gauge("hicache_page_tokens", "Tokens per page (P).")
      .Sample(engine.layout().page_size());
  f.Gauge("hicache_page_bytes",
          "Bytes of one page on one rank, device tier (target and draft).")
      .Sample(static_cast<double>(engine.geometry().BytesPerPage()));
}

// The storage tier (--l3_dir): only when it is on.
void AddStorage(const StorageTierReport& r, const EngineStats& s,
                FamilyBuilder& f) {
  if (!r.enabled) return;
  f.Gauge("hicache_storage_pages",
          "The storage tier's pages (all ranks): capacity and used.")
      .Sample(r.capacity_pages, {{"state", "capacity"}})
      .Sample(r.used_pages, {{"state", "used"}});
  f.Counter("hicache_storage_hit_tokens_total",
            "Tokens past the host hit that counted matches found in the "
            "storage tier.")
      .Sample(s.storage_hit_tokens);
  f.Counter("hicache_storage_writes_total",
            "Committed host pages for the storage tier, by outcome: written "
            "(or already there), dropped (the writer's queue was full), "
            "failed.")
      .Sample(r.pages_written, {{"outcome", "written"}})
      .Sample(r.pages_dropped, {{"outcome", "dropped"}})
      .Sample(r.write_errors, {{"outcome", "failed"}});
  f.Counter("hicache_storage_reads_total",
            "Pages read from the storage tier into the host tier, by "
            "outcome: intact, or failed (a miss, a checksum failure or an I/O "
            "error).")
      .Sample(r.pages_read, {{"outcome", "intact"}})
      .Sample(r.read_failures, {{"outcome", "failed"}});
  f.Counter("hicache_storage_checksum_failures_total",
            "Stored pages that failed their checksum (served as misses).")
      .Sample(r.checksum_failures);
  f.Counter("hicache_storage_evictions_total",
            "Pages the storage tier dropped to make room.")
      .Sample(r.evictions);
  f.Counter("hicache_storage_bytes_total",
            "Bytes written to and read from the storage tier.")
      .Sample(static_cast<double>(r.bytes_written), {{"direction", "write"}})
      .Sample(static_cast<double>(r.bytes_read), {{"direction", "read"}});
  f.Counter("hicache_storage_promotions_total",
            "Pages promoted from the storage tier to the host tier, and "
            "promotions failed or skipped.")
      .Sample(s.storage_promoted_pages, {{"outcome", "promoted_pages"}})
      .Sample(s.storage_promotions_failed, {{"outcome", "failed"}})
      .Sample(s.storage_promotions_skipped, {{"outcome", "skipped"}})
      .Sample(s.storage_refused_cost, {{"outcome", "refused_cost"}});
  f.Gauge("hicache_storage_read_ns_per_byte",
          "The storage tier's measured read cost (0 before the first read), "
          "which the cost model weighs against recomputing.")
      .Sample(r.read_ns_per_byte);
}

// Hot restart (--state_dir): only when it is on.
void AddPersistence(const HostTierPersistence& p, FamilyBuilder& f) {
  if (!p.enabled) return;
  f.Gauge("hicache_host_tier_recovered",
          "What recovery restored at start: nodes and host pages (all "
          "ranks); 0 after a cold start.")
      .Sample(p.nodes_recovered, {{"unit", "nodes"}})
      .Sample(p.pages_recovered, {{"unit", "pages"}});
  f.Gauge("hicache_host_tier_recovery_dropped",
          "Journal records dropped at start, with their subtrees, by reason: "
          "checksum (corrupt or stale pages), orphan (parent gone), "
          "conflict.")
      .Sample(p.dropped_checksum, {{"reason", "checksum"}})
      .Sample(p.dropped_orphan, {{"reason", "orphan"}})
      .Sample(p.dropped_conflict, {{"reason", "conflict"}});
  f.Gauge("hicache_host_tier_recovery_seconds",
          "How long recovery took at start (load, verify, restore, rewrite).")
      .Sample(absl::ToDoubleSeconds(p.recovery_time));
  f.Gauge("hicache_journal_ok",
          "1 while the host tier's journal works; 0 once it broke (a restart "
          "would then start cold).")
      .Sample(p.journal_status == "OK" ? 1 : 0);
  f.Gauge("hicache_journal_live_records",
          "Host nodes a restart would recover now.")
      .Sample(p.journal_live);
  f.Gauge("hicache_journal_file_bytes", "The journal's durable size.")
      .Sample(static_cast<double>(p.journal_file_bytes));
  f.Counter("hicache_journal_puts_refused_total",
            "Host copies committed but not recorded: the journal's recorder "
            "was too far behind (they will not survive a restart).")
      .Sample(static_cast<double>(p.journal_puts_refused));
  f.Gauge("hicache_journal_backlog_events",
          "Host-tier changes the journal's recorder has not handled yet "
          "(settling or behind): not durable.")
      .Sample(static_cast<double>(p.journal_backlog_events));
  f.Gauge("hicache_journal_not_durable_records",
          "Journal records accepted but not synced yet.")
      .Sample(static_cast<double>(p.journal_not_durable_records));
}

void AddTree(const TreeStats& tree, FamilyBuilder& f) {
  f.Gauge("hicache_tree_nodes", "Radix tree nodes (roots excluded).")
      .Sample(tree.nodes);
  f.Gauge("hicache_tree_tokens",
          "Cached tokens by tier: on device, with a committed host copy.")
      .Sample(tree.device_tokens, {{"tier", "device"}})
      .Sample(tree.host_tokens, {{"tier", "host"}});
  f.Gauge("hicache_tree_protected_tokens",
          "Device tokens under a lock (not evictable).")
      .Sample(tree.protected_tokens);
  f.Gauge("hicache_pending_backups", "Backups in flight in the tree.")
      .Sample(tree.pending_backups);
  f.Gauge("hicache_namespaces", "Namespaces the tree holds.")
      .Sample(tree.namespaces);
}

void AddSessions(const SessionManager::Census& census, FamilyBuilder& f) {
  f.Gauge("hicache_sessions", "Open sessions by role.")
      .Sample(census.scheduler_sessions, {{"role", "scheduler"}})
      .Sample(census.worker_sessions, {{"role", "worker"}});
  f.Gauge("hicache_session_streams",
          "Open BackupSession/LoadBack streams by the role of their session.")
      .Sample(census.scheduler_streams, {{"role", "scheduler"}})
      .Sample(census.worker_streams, {{"role", "worker"}});
  f.Gauge("hicache_session_locks", "Node locks held by sessions.")
      .Sample(census.locks);
}

void AddNamespaces(std::vector<NamespaceRow> rows, size_t max_rows,
                   FamilyBuilder& f) {
  rows = TopNamespaces(std::move(rows), max_rows);
  f.Gauge("hicache_namespace_tokens",
          "Cached tokens of the largest namespaces by tier (the rest: "
          "namespace=\"__other__\").");
  for (const NamespaceRow& r : rows) {
    f.Sample(r.device_tokens, {{"tenant", r.ns}, {"tier", "device"}});
    f.Sample(r.host_tokens, {{"tenant", r.ns}, {"tier", "host"}});
  }
  f.Gauge("hicache_namespace_nodes", "Tree nodes of the largest namespaces.");
  for (const NamespaceRow& r : rows) f.Sample(r.nodes, {{"tenant", r.ns}});
  f.Gauge("hicache_namespace_sessions",
          "Open sessions of the largest namespaces.");
  for (const NamespaceRow& r : rows) {
    f.Sample(r.sessions, {{"tenant", r.ns}});
  }
  f.Gauge("hicache_namespace_session_pages",
          "Device pages held by the sessions of the largest namespaces "
          "(allocated, not yet cached or freed).");
  for (const NamespaceRow& r : rows) {
    f.Sample(r.session_pages, {{"tenant", r.ns}});
  }
}

}  // namespace

std::vector<NamespaceUsage> CacheCollector::UsageByNamespace() const {
  MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - usage_time_ >= namespace_interval_) {
    usage_ = engine_->UsageByNamespace();
    usage_time_ = now;
  }
  return usage_;
}

std::vector<MetricFamily> CacheCollector::Collect() const {
  FamilyBuilder f;
  const BuildInfo& build = GetBuildInfo();
  f.Gauge("hicache_build_info", "Build identity; the value is 1.")
      .Sample(1, {{"version", build.version},
                  {"revision", build.git_revision},
                  {"backend", engine_->backend_name()}});
  AddEngine(engine_->Stats(), f);
  AddPools(*engine_, f);
  AddPersistence(engine_->Persistence(), f);
  AddStorage(engine_->StorageReport(), engine_->Stats(), f);
  AddTree(engine_->TreeStatistics(), f);
  AddQuotas(engine_->NamespaceQuotas(), f);
  const SessionManager::Census census = sessions_->TakeCensus();
  AddSessions(census, f);
  absl::flat_hash_map<std::string, NamespaceRow> rows;
  for (NamespaceUsage& usage : UsageByNamespace()) {
    NamespaceRow& row = rows[usage.ns];
    row.ns = std::move(usage.ns);
    row.nodes = usage.nodes;
    row.device_tokens = usage.device_tokens;
    row.host_tokens = usage.host_tokens;
  }
  for (const auto& [ns, sessions] : census.namespaces) {
    NamespaceRow& row = rows[ns];
    row.ns = ns;
    row.sessions = sessions.sessions;
    row.session_pages = sessions.pages;
  }
  std::vector<NamespaceRow> list;
  list.reserve(rows.size());
  for (auto& [ns, row] : rows) list.push_back(std::move(row));
  AddNamespaces(std::move(list), max_namespaces_, f);
  return f.Take();
}

}  // namespace hicache::metrics
