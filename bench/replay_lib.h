#pragma once

// In-process replay of a Mooncake-format trace through a HiCacheEngine, as a
// scheduler drives it: load-back (match + host hits), allocate and "compute"
// the rest, back up per layer (write_through), insert and attach, release.
// Reports per block: L1 hit rate and L1+L2 hit rate (a request's walk stops
// at its first block missing from both tiers).
//
// A deferred insert (a backup still in flight conflicts with it) is handled
// as a real scheduler must: wait until the conflicting backup settles, then
// insert again (up to `defer_retries` times); if it is still deferred, roll
// the request's backup back and free the pages it allocated -- nothing it
// holds is ever leaked. `leaked_pages` checks this at the end.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/mooncake_trace.h"
#include "daemon/core/policies.h"
#include "daemon/engine/engine_types.h"
#include "daemon/storage/page_store.h"

namespace hicache {

struct ReplayConfig {
  int64_t block_tokens = 512;  // Tokens per hash id.
  int64_t l1_blocks = 6000;    // Device (L1) capacity in blocks.
  int64_t l2_blocks = 12000;   // Host (L2) capacity in blocks.
  uint32_t page_size = 64;
  // KV geometry: "micro" (256 bytes a page at P = 64) keeps copies cheap;
  // "tiny" (2 KiB) and larger make them weigh as real KV does.
  std::string kv_preset = "micro";
  WritePolicy write_policy = WritePolicy::kWriteAhead;  // The daemon's.
  EvictionPolicy eviction_policy = EvictionPolicy::kTinyLfu;
  uint32_t write_through_threshold = 2;
  // Every backup settles (commits or rolls back) before the next request,
  // so the figures depend on the trace and configuration only: two runs
  // give identical numbers. Off: copies run on the transfer threads while
  // later requests proceed, as in a daemon.
  bool deterministic = true;
  int defer_retries = 1;
  // Test seam, "slow transfers": backup copy completions are held back and
  // released only every `slow_backups_for` requests (and when a deferred
  // insert waits), so backups stay in flight across requests. 0: off.
  int64_t slow_backups_for = 0;
  // Hot restart (EngineOptions::state_dir): non-empty journals the host
  // tier into this directory, as hicached --state_dir does. Every replay
  // starts cold: its host segments get a prefix of their own
  // ("/hicache-replay<pid>-<n>") and are removed when it ends.
  std::string state_dir;
  // KV events (docs/kv-events.md): non-empty publishes them on this PUB
  // endpoint in blocks of `kv_events_block_size` tokens, as hicached
  // --kv_events_endpoint does (subscribers are the caller's).
  std::string kv_events_endpoint;
  uint32_t kv_events_block_size = 16;
  // Per-namespace quotas (docs/quotas.md), in pages (a block is
  // block_tokens / page_size pages). Requests of each namespace run as one
  // session's holder bound to it.
  std::vector<NamespaceQuota> namespace_quotas;
  // The storage tier (L3, docs/storage-tier.md): > 0 gives the engine a
  // FilePageStore of this many blocks in `l3_dir` (empty: a temporary
  // directory, removed at the end), as hicached --l3_pages does. Its writes
  // settle before the next request in deterministic mode.
  int64_t l3_blocks = 0;
  std::string l3_dir;
};

// One namespace's share of a replay.
struct NamespaceOutcome {
  int64_t requests = 0;
  int64_t blocks = 0;
  int64_t l1_hit_blocks = 0;
  int64_t l12_hit_blocks = 0;
  // With a guarantee: requests of another namespace after which this one
  // held fewer pages of a tier than both its guarantee and what it held
  // before that request (the guarantee broken). Must be 0.
  int64_t guarantee_breaches = 0;
  // Least pages held after another namespace's request, once it had
  // reached its guarantee (-1: never reached it).
  int64_t min_device_pages_once_guaranteed = -1;
  int64_t min_host_pages_once_guaranteed = -1;
  double l12_rate() const {
    return blocks ? 1.0 * l12_hit_blocks / blocks : 0;
  }
};

struct ReplayOutcome {
  int64_t requests = 0;
  int64_t blocks = 0;
  int64_t l1_hit_blocks = 0;
  int64_t l12_hit_blocks = 0;
  // With a storage tier: blocks hit in any tier (L1, L2 or L3); the L3 hits
  // are l123_hit_blocks - l12_hit_blocks. Without one, l12_hit_blocks.
  int64_t l123_hit_blocks = 0;
  PageStoreStats store;  // The storage tier's counters.
  int64_t deferred_inserts = 0;   // Inserts that came back deferred.
  int64_t deferred_retried = 0;   // ... and then succeeded on a retry.
  int64_t deferred_gave_up = 0;   // ... and were given up (pages freed).
  int64_t failed_allocations = 0; // Requests that could not allocate.
  int64_t leaked_pages = 0;       // Request pages still held at the end.
  EngineStats stats;
  HostTierPersistence persistence;  // enabled only with a state_dir.
  double seconds = 0;
  // Of `seconds`: the final FlushHostTier (the journal's backlog at the end).
  double flush_seconds = 0;
  // CPU time of the thread that made the requests over `seconds` (the
  // serving path's own work: background threads are not in it).
  double caller_cpu_seconds = 0;
  double request_p50_us = 0;  // Wall time of one request's engine calls.
  double request_p99_us = 0;
  // Of a request, what Admit does after its match: allocating its new pages
  // (with any eviction and the write policy's work) and preparing its
  // per-layer backup. Requests that allocate nothing are not counted.
  double admit_p50_us = 0;
  double admit_p99_us = 0;
  // With kv_events_endpoint: what the publisher sent (after a final flush,
  // within `seconds`).
  int64_t kv_events = 0;
  int64_t kv_event_blocks = 0;
  int64_t kv_events_dropped = 0;
  int64_t kv_event_batches = 0;
  // After `seconds`: until the last event was sent (publishing lags behind
  // the requests while they keep the CPUs busy).
  double kv_events_lag_seconds = 0;

  // By namespace (TraceRequest::ns).
  std::map<std::string, NamespaceOutcome> namespaces;

  double l1_rate() const { return blocks ? 1.0 * l1_hit_blocks / blocks : 0; }
  double l12_rate() const {
    return blocks ? 1.0 * l12_hit_blocks / blocks : 0;
  }
  double l123_rate() const {
    return blocks ? 1.0 * l123_hit_blocks / blocks : 0;
  }
};

// Replays `trace` on a fresh engine; also checks the engine's invariants at
// the end (INTERNAL if they fail).
absl::StatusOr<ReplayOutcome> ReplayTrace(
    const std::vector<TraceRequest>& trace, const ReplayConfig& config);

}  // namespace hicache
