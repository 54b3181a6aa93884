#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/alloc/device_page_allocator.h"
#include "daemon/alloc/host_page_allocator.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/host_tier_recorder.h"
#include "daemon/engine/host_tier_recovery.h"
#include "daemon/engine/op_lifecycle.h"
#include "daemon/engine/storage_prefetcher.h"
#include "daemon/engine/storage_tier.h"
#include "daemon/persist/journal_writer.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/engine/page_ledger.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/radix/radix_tree.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

// The HiCache engine: one logical radix tree over the device (L1) and host
// (L2) pools of every CP rank this daemon serves. It decides and sequences;
// the transfer engine moves bytes, each rank copying only its owner lane.
//
// Concurrency: one mutex (mu_) guards the tree, the allocators and every
// operation record; transfers run outside it and report back through
// OnStepDone, which takes mu_. Engine listeners are called after mu_ is
// released. Lock order: HiCacheEngine::mu_ -> the transfer engine's locks
// (Submit is called with mu_ held; a transfer engine never calls back while
// holding its own lock).
//
// Data rules (docs/engine.md): a node is host-backed only after every rank's
// final ack of every step, target and draft; a ready backup waits for its
// node; load-back allocates exactly the recorded owners and never falls back
// to a plain allocation; nothing is freed while a copy may still touch it.
class HiCacheEngine : public TransferListener {
 public:
  static absl::StatusOr<std::unique_ptr<HiCacheEngine>> Create(
      const EngineOptions& options);
  ~HiCacheEngine() override;

  void SetListener(EngineListener* listener) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Requests -----------------------------------------------------------
  // Match; starts write-through backups of nodes that qualify. With
  // `peek`, a pure lookup: no hit recorded, no backup started, no stats.
  // With `lock`, the device hit's deepest node is locked in the same
  // critical section as the match, so nothing (an operator eviction) can
  // free the hit in between; an error if it cannot be locked. A locked hit
  // that ends inside a node splits it there, so the lock protects nothing
  // past the hit. `exact_tail`: see MatchOptions (false floors an exact
  // sub-page tail hit, as schedulers need).
  absl::StatusOr<MatchResult> Match(absl::string_view ns,
                                    absl::Span<const int32_t> tokens,
                                    bool peek = false, bool lock = false,
                                    bool exact_tail = true)
      ABSL_LOCKS_EXCLUDED(mu_);
  // --- KV events (engine_tier_events.cc; docs/kv-events.md) ---------------
  // What each tier holds of each sequence, for routers: the device hit and
  // the tokens past it loadable from the host tier, per item. A pure lookup
  // (no hit recorded, no recency touched, no lock taken), one critical
  // section for the whole batch.
  using TierQuery = hicache::TierQuery;  // engine_types.h
  using TierHit = hicache::TierHit;
  std::vector<TierHit> QueryTiers(absl::Span<const TierQuery> queries)
      ABSL_LOCKS_EXCLUDED(mu_);
  // With a tier listener (EngineOptions::tier_listener): withdraws every
  // announced block of `ns`, runs `between`, announces them again, in one
  // critical section (a namespace's events move to another topic).
  void ReannounceNamespace(absl::string_view ns,
                           absl::FunctionRef<void()> between)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Clears every announcement (the listener's OnAllCleared) and announces
  // the whole tree again: after the listener lost events. O(tree) under the
  // lock.
  void ResyncTierEvents() ABSL_LOCKS_EXCLUDED(mu_);
  // The tier listener is told nothing more (its owner is about to destroy
  // it; the engine may live on a little).
  void DetachTierListener() ABSL_LOCKS_EXCLUDED(mu_);

  // Page ownership: every allocated device page is held by exactly one of a
  // request holder (a client session; `holder`, default 0 for in-process
  // users), the tree or a load in flight (PageLedger). Free, Insert and
  // PrepareBackups accept only pages that `holder` holds (Insert also the
  // tree's own pages at their matched positions) and no repeated ids; a
  // refused call changes nothing.
  //
  // Pages for a running request, any lanes or an exact owner pattern. Short
  // lanes are freed by evicting unlocked device leaves in those lanes;
  // RESOURCE_EXHAUSTED carries the allocator accounting and what eviction
  // freed, and is returned at once (no eviction) for more pages than the
  // pool has.
  absl::StatusOr<std::vector<LogicalPage>> Allocate(int64_t num_pages,
                                                    uint64_t holder = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<LogicalPage>> AllocateWithOwners(
      absl::Span<const Rank> owners, uint64_t holder = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Returns request pages. FAILED_PRECONDITION for a page the tree holds or
  // a copy still uses; INVALID_ARGUMENT for a repeated id or a page that
  // `holder` does not hold (unallocated, or another holder's).
  absl::Status Free(absl::Span<const LogicalPage> pages, uint64_t holder = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Free's checks without freeing: distinct, all held by `holder`
  // (INVALID_ARGUMENT; FAILED_PRECONDITION for the tree's) and none used by
  // a backup in flight (FAILED_PRECONDITION).
  absl::Status CheckHeldBy(absl::Span<const LogicalPage> pages,
                           uint64_t holder) const ABSL_LOCKS_EXCLUDED(mu_);
  // Frees every page `holder` holds (those a copy still touches once it
  // completes); returns how many. For closing a session.
  int64_t FreeAllOf(uint64_t holder) ABSL_LOCKS_EXCLUDED(mu_);
  // Device pages held by `holder` / by every request holder together.
  int64_t RequestPages(uint64_t holder) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t AllRequestPages() const ABSL_LOCKS_EXCLUDED(mu_);
  // Usable device pages of all lanes (the reserved page 0 of each excluded).
  int64_t DevicePageCapacity() const;
  // Caches a request's KV. Duplicate and released pages are freed here (or
  // as soon as no copy uses them) and reported in the result; adopted pages
  // pass from `holder` to the tree, uncached ones stay with `holder`.
  absl::StatusOr<InsertResult> Insert(absl::string_view ns,
                                      absl::Span<const int32_t> tokens,
                                      absl::Span<const LogicalPage> pages,
                                      const InsertOptions& options = {},
                                      uint64_t holder = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What Insert would refuse (the page count, a repeated page, a page that
  // is neither `holder`'s nor the tree's at its matched position), without
  // changing anything.
  absl::Status CheckInsert(absl::string_view ns,
                           absl::Span<const int32_t> tokens,
                           absl::Span<const LogicalPage> pages,
                           uint64_t holder) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets namespace `ns` if the tree holds nothing of it; returns whether
  // it did.
  bool DropNamespaceIfEmpty(absl::string_view ns) ABSL_LOCKS_EXCLUDED(mu_);
  // The namespace of a live node; NOT_FOUND for an unknown node.
  absl::StatusOr<std::string> NamespaceOf(NodeId node) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Pins a node's host copy for `ttl` (zero unpins).
  absl::Status Pin(NodeId node, absl::Duration ttl) ABSL_LOCKS_EXCLUDED(mu_);
  // Tree dump for operators.
  std::vector<NodeInfo> Dump(const DumpFilter& filter) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Lock/Unlock of kNoNode (an empty hit) are no-ops.
  absl::Status Lock(NodeId node) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Unlock(NodeId node) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Backups for a forward pass ------------------------------------------
  // Batch admission: sums the host pages every spec needs per rank, runs one
  // host eviction step (down to the L2 free-room target), then reserves per
  // spec. A spec that still finds a rank short is skipped (op id 0, counted).
  // Every spec's pages must be distinct, held by `holder`, and appear in
  // no other spec of the batch.
  absl::StatusOr<std::vector<uint64_t>> PrepareBackups(
      absl::Span<const BackupSpec> specs, uint64_t holder = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Submits `step`'s device->host copies of each op, every served rank. A
  // backup whose copy failed is skipped (its failure was reported). With
  // `fences` (backends with events), a rank's copies wait for its fence;
  // INVALID_ARGUMENT (nothing submitted) for a fence of an unserved rank,
  // two for one rank, or one not registered for its rank.
  absl::Status LayerStored(absl::Span<const uint64_t> ops, uint32_t step,
                           absl::Span<const RankFence> fences = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  // One rank's share of LayerStored: the worker of `rank` wrote layer
  // `step` of each op; only that rank's copies are submitted (idempotent per
  // (op, step, rank)). The step counts as stored once every served rank
  // stored it, by either call. INVALID_ARGUMENT for a rank not served here
  // or a fence of another rank.
  absl::Status RankLayerStored(absl::Span<const uint64_t> ops, uint32_t step,
                               Rank rank, uint64_t fence = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Worker fences: see TransferEngine::RegisterFence / ReleaseFence.
  // FAILED_PRECONDITION on a backend without events.
  absl::StatusOr<uint64_t> RegisterFence(Rank rank, const std::string& handle);
  absl::Status ReleaseFence(uint64_t fence);
  // The backend's name ("cpu", "cuda", ...).
  const std::string& backend_name() const { return backend_name_; }
  bool backend_has_events() const { return backend_has_events_; }
  // Fallback: every step not yet submitted, at once (logs a warning).
  absl::Status StoreAllLayers(uint64_t op) ABSL_LOCKS_EXCLUDED(mu_);
  // Ties a backup to the node that now holds its pages (after Insert). The
  // node's device pages must be exactly the backup's. If the copies are
  // already done, commits now. ABORTED if a copy failed: roll it back.
  absl::Status AttachBackup(uint64_t op, NodeId node) ABSL_LOCKS_EXCLUDED(mu_);
  // True while the backup still needs its client: a step not yet stored
  // or no node attached. False once only copies stand between it and its
  // commit (or it is finished). NOT_FOUND for an unknown op.
  absl::StatusOr<bool> BackupAwaitsClient(uint64_t op) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Abandons a backup (request aborted, insert deferred or missed). Host
  // pages are freed once no copy touches them.
  absl::Status RollbackBackup(uint64_t op) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Load-back ------------------------------------------------------------
  // Matches and, for a host hit, loads the host-only nodes back with their
  // recorded owner pattern. Per-layer events follow through the listener;
  // on completion the nodes are attached and locked for the caller until
  // FinishLoad. The quota keeps room for the request's own extend: with
  // extend_tokens > 0 the load is a miss (kOverQuota) unless free plus
  // evictable device pages cover the load and ceil(extend_tokens / P) + 1
  // more pages. The request's own device prefix, which the load locks, is
  // not counted as evictable (seed 000's lock delta).
  using LoadBackOptions = hicache::LoadBackOptions;  // engine_types.h
  // With a storage tier, pages the tree lacks past its hit are first
  // promoted from the stores to the host tier (PromoteFromStorage), then
  // loaded like any host hit: LoadResult::storage_len says how much.
  absl::StatusOr<LoadResult> LoadBack(absl::string_view ns,
                                      absl::Span<const int32_t> tokens,
                                      const LoadBackOptions& options)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<LoadResult> LoadBack(absl::string_view ns,
                                      absl::Span<const int32_t> tokens)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return LoadBack(ns, tokens, LoadBackOptions{});
  }
  // True once the load's copies are done and its nodes attached; ABORTED if
  // the load failed (treat it as a miss and FinishLoad it).
  absl::StatusOr<bool> LoadDone(uint64_t op) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases the load's lock (or abandons it if still running); a failed
  // load's pages are freed and its device prefix unlocked here.
  absl::Status FinishLoad(uint64_t op) ABSL_LOCKS_EXCLUDED(mu_);

  // --- Operators ------------------------------------------------------------
  // Evicts down to the free-room targets now.
  absl::Status EnforceFreeRoom() ABSL_LOCKS_EXCLUDED(mu_);
  // Changes the free-room targets (pages per lane / per rank).
  absl::Status SetFreeRoom(int64_t l1_pages, int64_t l2_pages)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The free-room targets in force: {L1 pages per lane, L2 pages per rank}.
  std::pair<int64_t, int64_t> FreeRoomTargets() const ABSL_LOCKS_EXCLUDED(mu_);
  // Operator eviction: device pages per lane and host pages per rank (lists
  // shorter than C mean 0 for the rest). Returns the pages freed by this
  // call: {device, host}.
  absl::StatusOr<std::pair<int64_t, int64_t>> EvictPages(
      absl::Span<const int64_t> device_per_lane,
      absl::Span<const int64_t> host_per_rank) ABSL_LOCKS_EXCLUDED(mu_);
  LaneCounts LaneCountsOf(Rank lane) const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until every submitted copy has completed and been processed, and
  // its events have reached the listener; a write-ahead round that is due
  // runs first (it may start copies).
  void WaitForTransfers() ABSL_LOCKS_EXCLUDED(mu_, dispatch_mu_);

  // --- Lanes of a dead CP member (engine_lanes.cc; docs/engine.md) --------
  // A CP group's leader holds the tree and page metadata of every lane; when
  // the daemon that owns some lanes dies, their device and host pools die
  // with it. While any lane is unavailable: LoadBack is a miss
  // (kLaneUnavailable, no op started), PrepareBackups and write-through /
  // write-back staging start no backup (op id 0; every backup needs an ack
  // from every served rank, so each would wait on the dead one), matches
  // return nothing that has a device page or recorded page owner on an
  // unavailable lane, and Insert caches nothing from the first page on an
  // unavailable lane on. Making a lane available after a DropLanes of it
  // taints the request pages it holds then (allocated before the fresh pool
  // existed: never cached). INVALID_ARGUMENT (nothing changes) for a lane
  // outside [0, C).
  absl::Status SetLaneAvailability(absl::Span<const Rank> lanes,
                                   bool available) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SetLanesUnavailable(absl::Span<const Rank> lanes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return SetLaneAvailability(lanes, false);
  }
  absl::Status SetLanesAvailable(absl::Span<const Rank> lanes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return SetLaneAvailability(lanes, true);
  }
  std::vector<Rank> UnavailableLanes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets everything whose bytes lived on `lanes` (RadixTree::DropLanes):
  // device copies with a page there (and device copies below them) and
  // host copies with a page there are dropped, nodes left with neither are
  // removed with their subtrees, and their pages freed on every lane and
  // rank (the host-tier listener hears of each dropped host copy). Locked
  // or host-referenced nodes are detached: never matched again, deleted and
  // their pages freed when the last lock or load lets go. Backups in flight
  // with a page there or on a node that lost its device copy fail (never
  // commit), and loads with a page there or a dropped node fail (misses),
  // as a failed copy does (engine_failures.cc). Device pages that requests
  // hold on those lanes stay theirs but are tainted: Insert never caches
  // them (nor anything after them in the key) and PrepareBackups skips
  // them, until they are freed. Call SetLanesUnavailable first so that
  // nothing new lands there meanwhile. INVALID_ARGUMENT for a lane outside
  // [0, C) (nothing changes).
  absl::StatusOr<LaneDropCounts> DropLanes(absl::Span<const Rank> lanes)
      ABSL_LOCKS_EXCLUDED(mu_);

  // --- Namespace quotas (engine_quotas.cc; docs/quotas.md) ---------------
  // Sets the quota of quota.ns (every field 0: removes it). INVALID_ARGUMENT
  // (nothing changes) for an invalid quota, or guarantees of every
  // namespace together above a pool. Pages held over a lowered limit are
  // evicted by the namespace's next allocation, load or backup, not now.
  absl::Status SetNamespaceQuota(const NamespaceQuota& quota)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Every namespace with a quota, a root in the tree or bound holders, by
  // name. O(namespaces + bound holders).
  std::vector<NamespaceQuotaUsage> NamespaceQuotas() const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The namespace whose device limit a request holder's pages count
  // against (a session's). An unbound holder (0, in-process users) counts
  // against none and its allocations are limited by none. Rebinding moves
  // the holder.
  void BindHolder(uint64_t holder, absl::string_view ns)
      ABSL_LOCKS_EXCLUDED(mu_);
  void UnbindHolder(uint64_t holder) ABSL_LOCKS_EXCLUDED(mu_);

  EngineStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Hot restart (EngineOptions::state_dir): what recovery found at start,
  // and how the journal is doing. enabled = false without a state_dir.
  HostTierPersistence Persistence() const ABSL_LOCKS_EXCLUDED(mu_);
  // Makes every host-tier change so far durable (clean: the daemon stops on
  // purpose; SIGTERM). OK without a state_dir; the journal's error if it
  // broke. The destructor does it too (clean).
  absl::Status FlushHostTier(bool clean) ABSL_LOCKS_EXCLUDED(mu_);
  TreeStats TreeStatistics() const ABSL_LOCKS_EXCLUDED(mu_);
  // RadixTree::UsageByNamespace under the engine lock (O(nodes)).
  std::vector<NamespaceUsage> UsageByNamespace() const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string AccountingString() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t DeviceAvailable(Rank lane) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t HostUsedPages(Rank rank) const ABSL_LOCKS_EXCLUDED(mu_);
  // Allocated device pages (tree + requests + loads) and the tree's share.
  int64_t DeviceAllocatedPages() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t TreeDevicePages() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<NodeInfo> Inspect(NodeId node) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether a host copy of a new node below `parent` (the deepest node of
  // a request's hit; kNoNode for none) can join the host tier
  // (RadixTree::HostCopyCanJoinBelow): always, unless the tier is
  // prefix-closed (write_ahead) and `parent` is neither a namespace root nor
  // has a host copy or one in flight. A copy prepared anyway would not
  // attach.
  bool HostCopyCanJoin(NodeId parent) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the write policy backs up a request's new `pages` while its
  // forward runs (per-layer write-through, BACKUP_CHOICE_AUTO): always
  // under write_through; under write_ahead when HostCopyCanJoin(parent) and
  // the copy displaces nothing: every rank's free host pages (beyond its
  // free-room target) hold that rank's share of `pages`. A copy that needs
  // host eviction would be a copy of a hot node, the first one host
  // pressure drops, to be copied again when it grows cold (on the matched
  // trace: 7,000 more copies and as many drops, the same hit rate).
  bool BacksUpAtAdmit(NodeId parent, absl::Span<const LogicalPage> pages) const
      ABSL_LOCKS_EXCLUDED(mu_);
  const CpLayout& layout() const { return layout_; }
  const KvGeometry& geometry() const { return geometry_; }
  // The storage tier (L3), or nullptr without one.
  StorageTier* storage() const { return storage_.get(); }
  // Blocks until no promotion from the storage tier is queued or running
  // (prefetch policies best_effort and timeout; tests and replays).
  void WaitForPrefetches() ABSL_LOCKS_EXCLUDED(mu_) {
    if (prefetcher_ != nullptr) prefetcher_->WaitIdle();
  }
  // What the storage tier holds and did (enabled false without one).
  StorageTierReport StorageReport() const ABSL_LOCKS_EXCLUDED(mu_);
  const RankPools& pools() const { return *pools_; }
  const EngineOptions& options() const { return options_; }

  // Tree, allocator and page-ownership invariants: every allocated device page
  // is held by exactly one of the tree, a request or a load; every reserved
  // host page by exactly one committed copy, backup or load. For tests.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

  // TransferListener.
  void OnStepDone(StepDone done) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Op;

  HiCacheEngine(const EngineOptions& options, CpLayout layout,
                KvGeometry geometry);

  absl::Status CheckFreeableLocked(absl::Span<const LogicalPage> pages,
                                  uint64_t holder) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckInsertPagesLocked(absl::string_view ns,
                                     absl::Span<const int32_t> tokens,
                                     absl::Span<const LogicalPage> pages,
                                     uint64_t holder)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Match that counts the hit in the stats and starts the write-through
  // backups it qualifies (shared by Match and LoadBack).
  absl::StatusOr<MatchResult> CountedMatchLocked(
      absl::string_view ns, absl::Span<const int32_t> tokens,
      MatchOptions options) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocation for `holder` (kRequest or kLoad), recorded in the ledger.
  // `may_wait`: under write-back, wait (mu_ released) for the victims it
  // stages; only where no state read before the call is used after it.
  // `ns`: the namespace the pages count against (nullopt: none); its device
  // limit applies (FitDeviceQuotaLocked) and eviction for it may take its
  // own pages below its guarantee.
  absl::StatusOr<std::vector<LogicalPage>> AllocateLocked(
      absl::Span<const Rank> owners, int64_t any_lanes, PageHolder holder,
      bool may_wait, std::optional<absl::string_view> ns = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts device leaves until each lane has need[lane] + L1 free room free.
  DeviceEvictResult EvictDeviceLocked(absl::Span<const int64_t> need,
                                      bool may_wait,
                                      const EvictionScope& scope = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictHostLocked(absl::Span<const int64_t> need,
                       const EvictionScope& scope = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evict exactly target[lane] device pages / target[rank] host pages.
  DeviceEvictResult EvictDeviceTargetsLocked(absl::Span<const int64_t> target,
                                             bool may_wait,
                                             const EvictionScope& scope = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns the host pages freed.
  int64_t EvictHostTargetsLocked(absl::Span<const int64_t> target,
                                 const EvictionScope& scope = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Namespace quotas (engine_quotas.cc, where they are documented).
  std::optional<absl::string_view> HolderNamespaceLocked(uint64_t holder) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<std::string> QuotaNamespaceOfLocked(NodeId node) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t RequestPagesOfLocked(absl::string_view ns) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FitDeviceQuotaLocked(absl::string_view ns, int64_t pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FitHostQuotaLocked(absl::string_view ns,
                                  absl::Span<const int64_t> per_rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what a tree eviction released and counts it.
  DeviceEvictResult ApplyDeviceEvictionLocked(DeviceEvictResult result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Write policies (engine_write_policy.cc, where each helper is
  // documented): write-back staging, write-ahead rounds, host admission.
  std::vector<uint64_t> StageWriteBackLocked(absl::Span<const int64_t> need,
                                             std::vector<NodeId>* held,
                                             const EvictionScope& scope = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseHostRefsLocked(absl::Span<const NodeId> held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteAheadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteAheadDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Write-ahead's thread: runs the rounds made due until the engine stops.
  void WriteAheadLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool AdmitVictimLocked(NodeId node, absl::Span<const int64_t> pages,
                         absl::Span<const int64_t> host_free,
                         absl::flat_hash_map<std::string, int>*
                             host_victim_classes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddHostNeedLocked(NodeId node, absl::Span<const int64_t> need,
                         std::map<std::string, std::vector<int64_t>>* by_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictHostForBatchLocked(
      const std::map<std::string, std::vector<int64_t>>& by_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (mu_ released) until each op has committed, failed or ended, or
  // options_.write_back_wait has passed.
  void AwaitOpsLocked(absl::Span<const uint64_t> ops)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReserveHostLocked(absl::Span<const Rank> owners,
                                 std::vector<std::vector<int64_t>>* host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeHostLocked(const std::vector<std::vector<int64_t>>& host)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks pages as used by a copy / releases them (freeing those whose free
  // was requested meanwhile).
  bool UsedByLiveOpLocked(LogicalPage page) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AcquirePagesLocked(absl::Span<const LogicalPage> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePagesLocked(absl::Span<const LogicalPage> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeDeviceLocked(absl::Span<const LogicalPage> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One step of `op` for every served rank (only they have pools here).
  TransferTask MakeTask(const Op& op, uint32_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completions per step of an op: one per served rank.
  int64_t AcksPerStep() const;
  // Submits one step of `op` for every served rank and counts it
  // outstanding; a rank named in `fences` waits for its fence.
  // `only_rank`: submit just that rank's copies (-1: every served rank not
  // yet submitted for this step).
  absl::Status SubmitStepLocked(Op& op, uint32_t step,
                                absl::Span<const RankFence> fences = {},
                                int64_t only_rank = -1)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validation shared by LayerStored and RankLayerStored.
  absl::Status CheckStoredOpsLocked(absl::Span<const uint64_t> ops,
                                    uint32_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts an attached backup of a device-only node (write-through at a hit,
  // write-back of a victim); returns its op id, or 0 if none started.
  uint64_t StartBackupOfNodeLocked(NodeId node, bool write_back = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `op` by `trigger` (op_lifecycle.h); true if its state changed.
  // Every caller checked the state first: a refusal is an engine bug.
  bool AdvanceOpLocked(Op& op, OpTrigger trigger)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitLocked(Op& op, std::vector<OpEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishOpLocked(uint64_t id, std::vector<OpEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompleteLoadLocked(Op& op, std::vector<OpEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Transfer failures (engine_failures.cc): a failed copy ends its op; a
  // backup never commits, a load is a miss.
  void FailOpLocked(Op& op, Rank rank, uint32_t step,
                    const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishFailedBackupLocked(Op& op, std::vector<OpEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseSettledFailedBackupLocked(uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishFailedLoadLocked(Op& op, std::vector<OpEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseFailedLoadLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lanes of a dead CP member (engine_lanes.cc).
  bool AnyLaneDownLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return lanes_down_ > 0;
  }
  // Whether a backup of `pages` must not start: a lane is down, or a page is
  // tainted (counted).
  bool BackupBlockedByLanesLocked(absl::Span<const LogicalPage> pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tree insert, cut before the first page that may not be cached (on
  // an unavailable lane, or tainted); the rest is left uncached.
  absl::StatusOr<InsertResult> InsertCacheableLocked(
      absl::string_view ns, absl::Span<const int32_t> tokens,
      absl::Span<const LogicalPage> pages, const InsertOptions& options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Taints every request page on `lane`; returns how many were new.
  int64_t TaintRequestPagesLocked(Rank lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckInvariants' part: detached nodes' pages (host pages reported to
  // `hold_host`) and tainted pages.
  absl::Status CheckDroppedLocked(
      absl::FunctionRef<absl::Status(Rank, int64_t)> hold_host) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For errors about a tree page: why it may no longer be served (its lane
  // is unavailable, or its node was dropped with it), or "".
  std::string DroppedLaneHintLocked(LogicalPage page) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes released detached nodes and frees their pages.
  void ReapDroppedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees what DropLanes / ReapDetached took out of the tree.
  void FreeDroppedLocked(const LaneDropResult& dropped, LaneDropCounts* counts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Delivers queued events to the listener in queue order, one dispatcher at
  // a time. Lock order: dispatch_mu_ -> mu_ (briefly, to take the queue).
  void DispatchPending() ABSL_LOCKS_EXCLUDED(mu_, dispatch_mu_);

  // The storage tier (engine_storage.cc, where its helpers are documented).
  // LoadBackFromHost is LoadBack without it.
  absl::StatusOr<LoadResult> LoadBackFromHost(absl::string_view ns,
                                              absl::Span<const int32_t> tokens,
                                              const LoadBackOptions& options)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status OpenStorageTier();
  void MarkStoragePages(std::vector<NodeInfo>* nodes) const
      ABSL_LOCKS_EXCLUDED(mu_);
  bool LoadBeatsRecomputeLocked(int64_t pages) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<StoreKey> ContinuationKeys(absl::string_view ns,
                                         absl::Span<const int32_t> tokens,
                                         const MatchResult& match) const;
  int64_t StorageHitLocked(absl::string_view ns,
                           absl::Span<const int32_t> tokens,
                           const MatchResult& match) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StoreHostCopyLocked(NodeId node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t PromoteFromStorage(absl::string_view ns,
                             absl::Span<const int32_t> tokens)
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t PromoteForLoad(absl::string_view ns,
                         absl::Span<const int32_t> tokens)
      ABSL_LOCKS_EXCLUDED(mu_);

  const EngineOptions options_;
  const CpLayout layout_;
  const KvGeometry geometry_;
  std::unique_ptr<Backend> owned_backend_;
  std::string backend_name_;
  bool backend_has_events_ = false;
  std::unique_ptr<RankPools> pools_;
  std::unique_ptr<TransferEngine> transfer_;
  // Set once in Create; thread-safe itself.
  std::unique_ptr<StorageTier> storage_;
  // Promotions off the caller's thread (best_effort and timeout); stopped
  // first in the destructor.
  std::unique_ptr<StoragePrefetcher> prefetcher_;
  // Hot restart (engine_persistence.cc); null without a state_dir. The
  // recorder writes to the journal: destroyed first.
  // The host pages' keys, kept in shared memory (declared before the
  // recorder, which writes them, so that it is destroyed after it).
  std::unique_ptr<PageKeyStore> page_keys_;
  std::unique_ptr<persist::JournalWriter> journal_;
  std::unique_ptr<HostTierRecorder> recorder_;
  HostTierRecovery recovery_;  // Set once in Create.
  bool recovered_ = false;     // A journal was replayed at start.
  std::string cold_reason_;
  absl::Duration recovery_time_;
  absl::Duration load_time_;
  // Recovers the host tier and starts the journal (end of Create).
  absl::Status OpenHostTier() ABSL_LOCKS_EXCLUDED(mu_);
  // Detaches the recorder, flushes the journal (clean) and closes it.
  void CloseHostTier() ABSL_LOCKS_EXCLUDED(mu_);

  Mutex dispatch_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  CondVar idle_cv_;
  CondVar ops_cv_;  // Signalled at every step completion.
  // Events made under mu_, in order, waiting for DispatchPending.
  std::vector<OpEvent> event_queue_ ABSL_GUARDED_BY(mu_);
  EngineListener* listener_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::unique_ptr<RadixTree> tree_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DevicePageAllocator> device_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<HostPageAllocator>> host_ ABSL_GUARDED_BY(mu_);
  // Who holds every allocated device page: requests, the tree (adopted by
  // inserts or attached by loads), loads in flight.
  PageLedger ledger_ ABSL_GUARDED_BY(mu_);
  // Pages a copy in flight reads or writes, with their use counts, and those
  // whose free waits for the copies to finish.
  absl::flat_hash_map<LogicalPage, int32_t> busy_pages_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<LogicalPage> free_when_idle_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Op>> ops_ ABSL_GUARDED_BY(mu_);
  // Host references StageWriteBackLocked holds until ReleaseHostRefsLocked
  // (across AwaitOpsLocked, with mu_ released): node -> count. Each node
  // must stay in the tree with at least that many (CheckInvariants).
  absl::flat_hash_map<NodeId, int32_t> write_back_host_refs_
      ABSL_GUARDED_BY(mu_);
  // write_ahead: the last access of the warmest node of the cold window it
  // last copied; host eviction keeps copies of nodes not accessed since.
  int64_t write_ahead_boundary_ns_ ABSL_GUARDED_BY(mu_) = INT64_MIN;
  // Write-ahead: device pages allocated since its last scan, and whether
  // it has scanned since the tier was last far from full.
  int64_t write_ahead_allocated_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_ahead_scanned_ ABSL_GUARDED_BY(mu_) = false;
  // Write-ahead's thread (WriteAheadLoop): a round is due (set by
  // allocations and evictions; cleared in the critical section that runs
  // it), or the engine stops.
  bool write_ahead_due_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ahead_stop_ ABSL_GUARDED_BY(mu_) = false;
  CondVar write_ahead_cv_;
  std::thread write_ahead_thread_;
  uint64_t next_op_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t outstanding_steps_ ABSL_GUARDED_BY(mu_) = 0;
  // Completed steps whose EngineObserver call (made without mu_) has not
  // returned yet: WaitForTransfers waits for them too.
  int64_t observer_calls_ ABSL_GUARDED_BY(mu_) = 0;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  // Lanes of a dead CP member: unavailable lanes (sized C on first use) and
  // their count, and request pages on dropped lanes (never cached).
  std::vector<bool> lane_down_ ABSL_GUARDED_BY(mu_);
  // Dropped since they were last made available (readmission taints).
  std::vector<bool> lane_dropped_ ABSL_GUARDED_BY(mu_);
  int64_t lanes_down_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<LogicalPage> tainted_pages_ ABSL_GUARDED_BY(mu_);
  int64_t l1_free_room_ ABSL_GUARDED_BY(mu_);
  int64_t l2_free_room_ ABSL_GUARDED_BY(mu_);
  // Namespace quotas (engine_quotas.cc): the quota of each namespace that
  // has one, and the namespace of each bound request holder (both ways).
  absl::flat_hash_map<std::string, NamespaceQuota> quotas_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> holder_ns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> ns_holders_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
