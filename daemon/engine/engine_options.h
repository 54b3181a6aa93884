#pragma once

// How an engine is configured, and the one place where the daemon's
// configuration (DaemonConfig) becomes engine, tree and pool options.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/backend/backend.h"
#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/policies.h"
#include "daemon/engine/engine_observer.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/radix/radix_tree.h"
#include "daemon/storage/page_store.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

struct EngineOptions {
  // Configuration: the daemon's defaults (DaemonConfig::kDefault*), so an
  // engine built from EngineOptions{} runs what hicached ships. A test that
  // needs another configuration names it.
  uint32_t page_size = DaemonConfig::kDefaultPageSize;
  uint32_t cp_size = DaemonConfig::kDefaultCpSize;
  std::string kv_preset = std::string(DaemonConfig::kDefaultKvPreset);
  // Not empty: the KV layout's families, named kv_preset (a layout file;
  // KvGeometry::Resolve).
  std::vector<KvFamily> kv_families;
  // Including the reserved page 0.
  int64_t device_pages_per_rank =
      static_cast<int64_t>(DaemonConfig::kDefaultDevicePagesPerRank);
  int64_t host_pages_per_rank =
      static_cast<int64_t>(DaemonConfig::kDefaultHostPagesPerRank);
  HostLayout host_layout = HostLayout::kLayerFirst;
  bool lock_host_memory = false;
  WritePolicy write_policy = DaemonConfig::kDefaultWritePolicy;
  // For kWriteThroughSelective.
  uint32_t write_through_threshold =
      DaemonConfig::kDefaultWriteThroughThreshold;
  EvictionPolicy eviction_policy = DaemonConfig::kDefaultEvictionPolicy;
  // Loads of fewer tokens are not worth a transfer: reported as misses.
  int64_t load_back_threshold_tokens = 0;
  // After pressure, evict until this many pages are free per lane (L1) and
  // per rank (L2), not just the deficit.
  int64_t l1_free_room_pages = 0;
  int64_t l2_free_room_pages = 0;
  // Per-namespace page quotas at start (docs/quotas.md);
  // HiCacheEngine::SetNamespaceQuota changes them.
  std::vector<NamespaceQuota> namespace_quotas;
  // Ranks whose pools and copies this engine owns (ascending; empty: all
  // C). The tree, the allocators and the host metadata always cover all C
  // lanes (one logical page space); pools exist and copies run only for
  // these ranks, and an op completes when each of them has acked each step.
  std::vector<Rank> served_ranks;
  // Ranks whose pools live in this process (ascending; empty: the served
  // ranks). A CP group's leader (docs/cp-groups.md) serves every rank of
  // its group, since every rank's acks count, but holds pools only for its
  // own; the other ranks' copies go to their daemons through
  // `wrap_transfer`. Must be a subset of the served ranks; a state_dir needs
  // them all.
  std::vector<Rank> pool_ranks;
  // Default backend's copy threads.
  int transfer_workers = DaemonConfig::kDefaultTransferWorkers;
  // Hot restart (docs/hot-restart.md): the directory of the host tier's
  // journal. Non-empty: the host pools outlive the daemon and the host tier
  // is recovered at start. Empty: the host tier dies with the daemon.
  std::string state_dir;
  // Threads that verify host pages at recovery.
  int recovery_threads = DaemonConfig::kDefaultRecoveryThreads;
  // How long a host commit waits before it is journaled
  // (HostTierRecorder::Options::settle).
  // The storage tier's cost model: see DaemonConfig.
  int64_t storage_recompute_ns_per_token =
      DaemonConfig::kDefaultStorageRecomputeNsPerToken;
  PrefetchPolicy storage_prefetch = PrefetchPolicy::kWaitComplete;
  absl::Duration storage_prefetch_timeout = absl::Milliseconds(100);
  absl::Duration journal_settle =
      absl::Milliseconds(DaemonConfig::kDefaultJournalSettleMs);

  // Not configuration: what the process wires in (EngineOptionsFrom leaves
  // these at their defaults).
  const Clock* clock = nullptr;  // Default: Clock::Real().
  // Where pools live and what copies (must outlive the engine). Default: a
  // CpuBackend (shared memory, memcpy) the engine owns.
  Backend* backend = nullptr;
  // Name prefix of the default backend's segments: the daemon's
  // ShmInstance::prefix(). Empty: "/hicache-<pid>-e<address>", unique per
  // engine (tests and tools without a daemon).
  std::string shm_prefix;
  // Refuse pools larger than the machine has (Backend::CheckCapacity)
  // before taking any memory.
  bool check_capacity = true;
  // Write-back: how long an allocation waits for the copies of the victims
  // it staged (the engine lock is released meanwhile) before it evicts
  // without them.
  absl::Duration write_back_wait = absl::Seconds(5);
  // Write-ahead runs its rounds on its own thread, off the allocation that
  // made one due; false: inside that allocation (reproducible replays and
  // tests that count what a round did after a call returns).
  bool write_ahead_thread = true;
  // KV events (docs/kv-events.md): told of every change to what each tier
  // can serve, in blocks of `tier_block_size` tokens (0: the page size; a
  // divisor of it) hashed from `tier_hash_seed`. Not owned, must outlive
  // the engine. Null: none.
  TierListener* tier_listener = nullptr;
  uint32_t tier_block_size = 0;
  uint64_t tier_hash_seed = 0;
  // Per-layer copy timings (metrics); not owned, must outlive the engine.
  // Null: none.
  EngineObserver* observer = nullptr;
  // Transfer decorator seam (fault injection in tests; a CP group's routing
  // of remote ranks, daemon/group): wraps the backend's transfer engine.
  // Given the engine's listener and a factory of the backend engine (over
  // the pools of `pool_ranks` only), returns the transfer engine to use; a
  // decorator builds the backend engine with itself as its listener and
  // reports completions to `listener`. Empty: the backend engine as is.
  std::function<std::unique_ptr<TransferEngine>(
      TransferListener* listener, const TransferEngineFactory& backend)>
      wrap_transfer;
  // The storage tier (L3, docs/storage-tier.md): one store per CP rank
  // (cp_size entries; one store may serve several ranks), each of pages of
  // the geometry's BytesPerPage(). Not owned, must outlive the engine.
  // Empty: no storage tier.
  std::vector<PageStore*> storage;
};

// Every configuration field of `config` the engine takes, carried over
// as is: geometry (page size, CP size, served ranks, KV preset, pool sizes,
// host layout, host-memory locking), policies, thresholds, free room and
// transfer workers. The process-wiring fields (clock, backend, shm_prefix,
// ...) keep their defaults for the caller to set. REQUIRES: `config` is
// valid and its host tier resolved (ResolveHostPages), so that
// host_pages_per_rank is the tier's size whichever flag gave it.
EngineOptions EngineOptionsFrom(const DaemonConfig& config);

// The pools an engine with `options` creates.
RankPoolsOptions RankPoolsOptionsFrom(const EngineOptions& options);

// The tree an engine with `options` keeps. The write policy becomes the
// tree's write-through report threshold: 1 for write-through (every hit),
// write_through_threshold (at least 1) for selective write-through, 0 (never)
// for write-back.
RadixTreeOptions RadixTreeOptionsFrom(const EngineOptions& options);

}  // namespace hicache
