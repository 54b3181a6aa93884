#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/backend/backend.h"
#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/policies.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/op_event.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/radix/eviction_policy.h"
#include "daemon/core/namespace_quota.h"
#include "daemon/radix/radix_tree.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

class PoolBackend;

// A fence a worker registered (HiCacheEngine::RegisterFence) for its rank,
// named by a layer_stored: that rank's copy waits for it.
struct RankFence {
  Rank rank = 0;
  uint64_t fence = 0;
};

// A backup the scheduler prepares for one request before its forward pass.
struct BackupSpec {
  std::vector<LogicalPage> pages;  // The request's new pages, in order.
  int64_t logical_len = 0;         // Valid tokens they hold.
};

enum class LoadMissReason {
  kNone,            // Loaded (or nothing on host).
  kBelowThreshold,  // Shorter than load_back_threshold_tokens.
  kOverQuota,       // More than free + evictable device pages.
  kNoDeviceMemory,  // Owner lanes short even after targeted eviction.
  kLoadInFlight,    // Another load of these nodes is running.
  kLaneUnavailable, // A lane is unavailable (its CP member died).
  kNamespaceQuota,  // Over its namespace's device limit, even after
                    // evicting the namespace's own pages.
};
absl::string_view LoadMissReasonName(LoadMissReason reason);

struct LoadResult {
  uint64_t op_id = 0;  // 0 when nothing is loaded.
  LoadMissReason miss = LoadMissReason::kNone;
  int64_t device_len = 0;  // Tokens already on device before the load.
  int64_t loaded_len = 0;  // Tokens this load brings back (valid only).
  // Of loaded_len: tokens first promoted from the storage tier (L3).
  int64_t storage_len = 0;
  // Locations: pages covering device_len + loaded_len valid tokens.
  std::vector<LogicalPage> pages;
  uint32_t num_steps = 0;  // Per-layer events to wait for.
  NodeId node = kNoNode;   // Deepest node of the hit.
  // Set by SessionManager when the device hit was locked for a session
  // (nothing to load): the lock's handle.
  uint64_t lock_handle = 0;
};

// HiCacheEngine::LoadBack's options (HiCacheEngine::LoadBackOptions).
struct LoadBackOptions {
  int64_t extend_tokens = 0;
  bool exact_tail = true;  // See MatchOptions.
};

// One item of HiCacheEngine::QueryTiers (KV events), and its answer
// (HiCacheEngine::TierQuery, HiCacheEngine::TierHit).
struct TierQuery {
  absl::string_view ns;
  absl::Span<const int32_t> tokens;
};
struct TierHit {
  int64_t device_tokens = 0;
  int64_t host_tokens = 0;  // Past the device hit.
};

// Per-layer and completion events, for the service to stream. Called
// without engine locks held, from transfer worker threads.
class EngineListener {
 public:
  virtual ~EngineListener() = default;
  // Every event of every op, in order per op, never under the engine's lock.
  virtual void OnOpEvent(const OpEvent& event) = 0;
};

// Hot restart (HiCacheEngine::Persistence).
struct HostTierPersistence {
  bool enabled = false;
  bool recovered = false;  // A journal was replayed at start.
  std::string cold_reason; // Why the start was cold, when it was.
  int64_t nodes_recovered = 0;
  int64_t pages_recovered = 0;
  int64_t dropped_checksum = 0;
  int64_t dropped_orphan = 0;
  int64_t dropped_conflict = 0;
  uint64_t verified_bytes = 0;
  absl::Duration recovery_time;  // Load, verify, restore, journal rewrite.
  absl::Duration load_time;      // Reading and replaying the journal.
  absl::Duration verify_time;    // Checksumming every recorded page.
  absl::Duration restore_time;   // Reserving pages, rebuilding the tree.
  int64_t journal_puts = 0;       // Host copies recorded since the start.
  int64_t journal_live = 0;       // Records a restart would replay.
  uint64_t journal_file_bytes = 0;
  std::string journal_status;     // "OK" or why it broke.
  int64_t journal_puts_refused = 0;  // Committed, not recorded (behind).
  bool journal_stopped = false;      // The recorder stopped (overrun).
  // Not durable yet: host-tier changes the recorder has not handled
  // (settling or behind), and records the journal has not synced. Both 0:
  // everything reported so far would survive a crash.
  int64_t journal_backlog_events = 0;
  int64_t journal_not_durable_records = 0;
  // Since the start: a host-tier change's time from its report to its
  // hand-over to the journal (the settle window included), and a batch's
  // from its oldest record to its sync; each at most 19% high.
  absl::Duration recorder_lag_p50, recorder_lag_p99, recorder_lag_max;
  absl::Duration writer_lag_p50, writer_lag_p99, writer_lag_max;
};

struct EngineStats {
  int64_t match_calls = 0;
  int64_t device_hit_tokens = 0;
  int64_t host_hit_tokens = 0;
  int64_t query_tokens = 0;
  int64_t backups_started = 0;
  int64_t backups_committed = 0;
  int64_t backups_rolled_back = 0;
  int64_t backups_skipped_no_host = 0;
  int64_t fallback_backups = 0;  // All-layer backups after the forward.
  int64_t write_back_backups = 0;
  // Write-back victims refused by admission (removed, not demoted).
  int64_t write_back_rejected = 0;
  // Allocations and loads that waited for write-back copies (AwaitOpsLocked
  // found one still copying), and backups write_ahead started.
  int64_t copy_waits = 0;
  int64_t write_ahead_backups = 0;
  // Device eviction victims moved to the host tier, and removed (unbacked;
  // their host-only descendants go with them).
  int64_t device_victims_to_host = 0;
  int64_t device_victims_removed = 0;
  // Redundant host copies of device nodes dropped for host room.
  int64_t host_copies_dropped = 0;
  int64_t loads_started = 0;
  int64_t loads_done = 0;
  int64_t load_misses = 0;
  int64_t device_eviction_steps = 0;
  int64_t host_eviction_steps = 0;
  int64_t device_evicted_pages = 0;
  int64_t host_evicted_pages = 0;
  int64_t device_alloc_failures = 0;
  // Namespace quotas (docs/quotas.md): allocations and loads refused by a
  // device limit, backups not started by a host limit, and the pages
  // evicted to keep namespaces under their limits.
  int64_t quota_refusals = 0;
  int64_t backups_skipped_quota = 0;
  int64_t quota_evicted_pages = 0;
  uint64_t bytes_to_host = 0;
  uint64_t bytes_to_device = 0;
  int64_t step_latency_ns_total = 0;  // Submit to completion, all steps.
  int64_t steps_completed = 0;
  // Transfer failures: failed copy completions (and write-back copies), and
  // the backups (never committed) and loads (misses) they ended.
  int64_t copy_failures = 0;
  int64_t backups_failed = 0;
  int64_t loads_failed = 0;
  // Lanes of a dead CP member (docs/engine.md, "Engine: lanes of a dead
  // member"): loads that were misses and backups not started because a
  // lane was unavailable (or a page was on a dropped lane), inserts cut
  // short before such a page, and what DropLanes took (nodes_removed
  // includes detached nodes deleted later, when released).
  int64_t load_misses_lane_unavailable = 0;
  int64_t backups_skipped_lane_unavailable = 0;
  int64_t inserts_cut_by_lanes = 0;
  int64_t lane_drops = 0;
  int64_t lane_nodes_removed = 0;
  int64_t lane_nodes_detached = 0;
  int64_t lane_device_copies_dropped = 0;
  int64_t lane_host_copies_dropped = 0;
  int64_t lane_ops_failed = 0;
  // The storage tier (docs/storage-tier.md): loads that asked it, the pages
  // it held past the tree's hit, those promoted to the host tier, and
  // promotions given up after the reads (the attach point changed, or the
  // reads failed), or not tried (no host room, or an attach point the
  // prefix-closed host tier refuses).
  int64_t storage_hit_tokens = 0;  // Reported by counted matches.
  int64_t storage_lookups = 0;
  int64_t storage_hit_pages = 0;
  int64_t storage_promoted_pages = 0;
  int64_t storage_promotions_failed = 0;
  int64_t storage_promotions_skipped = 0;
  // Promotions the cost model refused: reading would be slower than
  // recomputing.
  int64_t storage_refused_cost = 0;
};

// The storage tier (L3) as GetStats reports it.
struct StorageTierReport {
  bool enabled = false;
  std::vector<std::string> stores;  // Described.
  int64_t capacity_pages = 0;
  int64_t used_pages = 0;
  int64_t pages_queued = 0;   // Committed host pages handed to the writer.
  int64_t pages_dropped = 0;  // Not written: the writer's queue was full.
  int64_t pages_written = 0;
  int64_t write_errors = 0;
  int64_t pages_read = 0;     // Read into host pages intact.
  int64_t read_failures = 0;  // Misses, checksum failures and I/O errors.
  int64_t checksum_failures = 0;
  int64_t evictions = 0;      // Pages the stores dropped for room.
  int64_t bytes_written = 0;
  int64_t bytes_read = 0;
  double read_ns_per_byte = 0;  // The measured read cost (0: not yet).
  // Prefetch policies other than wait_complete: promotions queued, dropped
  // (the queue was full), and loads whose wait ran out (timeout).
  int64_t prefetches_started = 0;
  int64_t prefetches_dropped = 0;
  int64_t prefetch_waits_timed_out = 0;
};

// A namespace's quota and what it holds (HiCacheEngine::NamespaceQuotas),
// in logical pages.
struct NamespaceQuotaUsage {
  NamespaceQuota quota;  // Every limit 0: none set.
  int64_t device_cached_pages = 0;   // Its nodes' device pages.
  int64_t device_request_pages = 0;  // Its sessions' request pages.
  int64_t host_pages = 0;  // Its host copies and backups in flight.
};

// What one HiCacheEngine::DropLanes call did.
struct LaneDropCounts {
  int64_t nodes_removed = 0;   // Deleted now.
  int64_t nodes_detached = 0;  // Locked or being loaded: unmatchable now,
                               // deleted when released.
  int64_t device_copies_dropped = 0;  // Nodes now host-only.
  int64_t host_copies_dropped = 0;    // Nodes still on device, host copy gone.
  int64_t device_pages_freed = 0;     // Tree pages returned (all lanes).
  int64_t host_pages_freed = 0;       // Host pages returned (all ranks).
  int64_t backups_failed = 0;         // In flight, never commit.
  int64_t loads_failed = 0;           // In flight, misses.
  int64_t request_pages_tainted = 0;  // Request pages never to be cached.
};

}  // namespace hicache
