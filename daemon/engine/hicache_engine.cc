#include "daemon/engine/hicache_engine.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_op.h"
#include "daemon/backend/cpu/cpu_backend.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::string_view LoadMissReasonName(LoadMissReason reason) {
  switch (reason) {
    case LoadMissReason::kNone:
      return "none";
    case LoadMissReason::kBelowThreshold:
      return "below_threshold";
    case LoadMissReason::kOverQuota:
      return "over_quota";
    case LoadMissReason::kNamespaceQuota:
      return "namespace_quota";
    case LoadMissReason::kNoDeviceMemory:
      return "no_device_memory";
    case LoadMissReason::kLoadInFlight:
      return "load_in_flight";
    case LoadMissReason::kLaneUnavailable:
      return "lane_unavailable";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<HiCacheEngine>> HiCacheEngine::Create(
    const EngineOptions& options) {
  absl::StatusOr<CpLayout> layout = CpLayout::Create(
      options.page_size, options.cp_size, options.served_ranks);
  if (!layout.ok()) return layout.status();
  // The ranks with pools here: a subset of the served ones.
  for (Rank r : options.pool_ranks) {
    if (!layout->Serves(r)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pool rank ", r, " is not a rank this engine serves"));
    }
  }
  absl::StatusOr<CpLayout> pool_layout =
      options.pool_ranks.empty()
          ? layout
          : CpLayout::Create(options.page_size, options.cp_size,
                             options.pool_ranks);
  if (!pool_layout.ok()) return pool_layout.status();
  if (!options.state_dir.empty() &&
      pool_layout->served_ranks().size() != options.cp_size) {
    return absl::InvalidArgumentError(
        "state_dir needs every rank's pools in this engine: the host tier of "
        "a multi-daemon CP group does not persist yet");
  }
  absl::StatusOr<KvGeometry> geometry = KvGeometry::Resolve(
      options.kv_preset, options.kv_families, options.page_size);
  if (!geometry.ok()) return geometry.status();
  if (options.host_pages_per_rank < 1) {
    return absl::InvalidArgumentError(
        "the engine needs a host pool: host_pages_per_rank must be >= 1");
  }
  std::unique_ptr<HiCacheEngine> engine(
      new HiCacheEngine(options, *layout, *geometry));
  Backend* backend = options.backend;
  if (backend == nullptr) {
    engine->owned_backend_ = std::make_unique<CpuBackend>(CpuBackend::Options{
        .shm_prefix = !options.shm_prefix.empty()
                          ? options.shm_prefix
                          : absl::StrCat("/hicache-", getpid(), "-e",
                                         reinterpret_cast<uintptr_t>(
                                             engine.get())),
        .transfer_workers = options.transfer_workers});
    backend = engine->owned_backend_.get();
  }
  engine->backend_name_ = backend->name();
  engine->backend_has_events_ = backend->has_events();
  RankPoolsOptions pool_options = RankPoolsOptionsFrom(options);
  if (!options.state_dir.empty()) {
    pool_options.persistent_host_fingerprint =
        engine->geometry_.HostFingerprint(options.host_layout,
                                          options.host_pages_per_rank,
                                          options.cp_size);
  }
  if (options.check_capacity) {
    absl::Status fits = backend->CheckCapacity(RankPools::SizesFor(
        *pool_layout, engine->geometry_, pool_options));
    if (!fits.ok()) return fits;
  }
  absl::StatusOr<std::unique_ptr<RankPools>> pools =
      RankPools::Create(*pool_layout, engine->geometry_, pool_options,
                        backend->pools());
  if (!pools.ok()) return pools.status();
  engine->pools_ = *std::move(pools);

  absl::StatusOr<DevicePageAllocator> device = DevicePageAllocator::Create(
      engine->layout_, options.device_pages_per_rank * options.cp_size);
  if (!device.ok()) return device.status();
  absl::StatusOr<std::unique_ptr<RadixTree>> tree =
      RadixTree::Create(RadixTreeOptionsFrom(options));
  if (!tree.ok()) return tree.status();
  {
    MutexLock lock(&engine->mu_);
    engine->device_ = std::make_unique<DevicePageAllocator>(*std::move(device));
    engine->tree_ = *std::move(tree);
    if (options.tier_listener != nullptr) {
      absl::Status set = engine->tree_->SetTierListener(
          options.tier_listener,
          options.tier_block_size == 0 ? options.page_size
                                       : options.tier_block_size,
          options.tier_hash_seed);
      if (!set.ok()) return set;
    }
    for (Rank r = 0; r < options.cp_size; ++r) {
      engine->host_.push_back(std::make_unique<HostPageAllocator>(
          *HostPageAllocator::Create(options.host_pages_per_rank)));
    }
  }
  const TransferEngineFactory backend_transfer =
      [pools = engine->pools_.get(), backend](TransferListener* listener) {
        return backend->CreateTransferEngine(pools, listener);
      };
  engine->transfer_ =
      options.wrap_transfer
          ? options.wrap_transfer(engine.get(), backend_transfer)
          : backend_transfer(engine.get());
  if (engine->transfer_ == nullptr) {
    return absl::InvalidArgumentError("wrap_transfer returned no engine");
  }
  for (const NamespaceQuota& quota : options.namespace_quotas) {
    if (absl::Status s = engine->SetNamespaceQuota(quota); !s.ok()) return s;
  }
  if (absl::Status host_tier = engine->OpenHostTier(); !host_tier.ok()) {
    return host_tier;
  }
  if (absl::Status storage = engine->OpenStorageTier(); !storage.ok()) {
    return storage;
  }
  if (options.write_policy == WritePolicy::kWriteAhead &&
      options.write_ahead_thread) {
    HiCacheEngine* raw = engine.get();
    engine->write_ahead_thread_ = std::thread([raw] { raw->WriteAheadLoop(); });
  }
  return engine;
}

absl::StatusOr<uint64_t> HiCacheEngine::RegisterFence(
    Rank rank, const std::string& handle) {
  return transfer_->RegisterFence(rank, handle);
}

absl::Status HiCacheEngine::ReleaseFence(uint64_t fence) {
  return transfer_->ReleaseFence(fence);
}

HiCacheEngine::HiCacheEngine(const EngineOptions& options, CpLayout layout,
                             KvGeometry geometry)
    : options_(options),
      layout_(std::move(layout)),
      geometry_(std::move(geometry)),
      l1_free_room_(options.l1_free_room_pages),
      l2_free_room_(options.l2_free_room_pages) {}

HiCacheEngine::~HiCacheEngine() {
  prefetcher_.reset();  // Its promotions use everything below.
  if (write_ahead_thread_.joinable()) {
    {
      MutexLock lock(&mu_);
      write_ahead_stop_ = true;
      write_ahead_cv_.SignalAll();
    }
    write_ahead_thread_.join();
  }
  // Stop the workers (they call OnStepDone) before the state goes away.
  if (transfer_ != nullptr) transfer_->Drain();
  transfer_.reset();
  CloseHostTier();
}

void HiCacheEngine::SetListener(EngineListener* listener) {
  MutexLock lock(&mu_);
  listener_ = listener;
}

absl::StatusOr<MatchResult> HiCacheEngine::Match(
    absl::string_view ns, absl::Span<const int32_t> tokens, bool peek,
    bool lock_hit, bool exact_tail) {
  MutexLock lock(&mu_);
  const MatchOptions options{.record_hit = !peek,
                             .exact_tail = exact_tail,
                             .split_at_hit = lock_hit};
  absl::StatusOr<MatchResult> match =
      peek ? tree_->MatchPrefix(ns, tokens, options)
           : CountedMatchLocked(ns, tokens, options);
  if (match.ok() && storage_ != nullptr) {
    match->storage_hit_len = StorageHitLocked(ns, tokens, *match);
    if (!peek) stats_.storage_hit_tokens += match->storage_hit_len;
  }
  if (!match.ok() || !lock_hit || match->device_len == 0) return match;
  if (absl::Status locked = tree_->Lock(match->last_device_node);
      !locked.ok()) {
    return absl::InternalError(absl::StrCat("locking the hit (node ",
                                            match->last_device_node,
                                            "): ", locked.message()));
  }
  return match;
}

absl::StatusOr<MatchResult> HiCacheEngine::CountedMatchLocked(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    MatchOptions options) {
  absl::StatusOr<MatchResult> match = tree_->MatchPrefix(ns, tokens, options);
  if (!match.ok()) return match;
  ++stats_.match_calls;
  stats_.query_tokens += tokens.size();
  stats_.device_hit_tokens += match->device_len;
  stats_.host_hit_tokens += match->host_hit_len;
  for (NodeId node : match->write_through_candidates) {
    StartBackupOfNodeLocked(node);
  }
  return match;
}

DeviceEvictResult HiCacheEngine::EvictDeviceLocked(
    absl::Span<const int64_t> need, bool may_wait,
    const EvictionScope& scope) {
  std::vector<int64_t> target(layout_.cp_size(), 0);
  for (Rank l = 0; l < layout_.cp_size(); ++l) {
    const int64_t available = device_->Counts(l).available();
    if (need[l] > available) {
      target[l] = need[l] - available + l1_free_room_;
    }
  }
  return EvictDeviceTargetsLocked(target, may_wait, scope);
}

DeviceEvictResult HiCacheEngine::EvictDeviceTargetsLocked(
    absl::Span<const int64_t> target, bool may_wait,
    const EvictionScope& scope) {
  if (std::all_of(target.begin(), target.end(),
                  [](int64_t t) { return t <= 0; })) {
    return DeviceEvictResult{};
  }
  std::vector<NodeId> held;
  if (options_.write_policy == WritePolicy::kWriteBack) {
    const std::vector<uint64_t> staged =
        StageWriteBackLocked(target, &held, scope);
    if (may_wait) AwaitOpsLocked(staged);
  }
  DeviceEvictResult result =
      ApplyDeviceEvictionLocked(tree_->EvictDevice(target, scope));
  ReleaseHostRefsLocked(held);
  WriteAheadDueLocked();
  return result;
}

DeviceEvictResult HiCacheEngine::ApplyDeviceEvictionLocked(
    DeviceEvictResult result) {
  ++stats_.device_eviction_steps;
  stats_.device_victims_to_host += result.nodes_to_host;
  stats_.device_victims_removed += result.nodes_removed;
  int64_t freed = 0;
  for (const auto& lane : result.freed_pages) {
    ledger_.Remove(lane);
    FreeDeviceLocked(lane);
    freed += lane.size();
  }
  FreeHostLocked(result.freed_host_pages);
  stats_.device_evicted_pages += freed;
  spdlog::debug("device eviction freed {} pages ({} to host, {} removed)",
                freed, result.nodes_to_host, result.nodes_removed);
  return result;
}

void HiCacheEngine::EvictHostLocked(absl::Span<const int64_t> need,
                                    const EvictionScope& scope) {
  std::vector<int64_t> target(layout_.cp_size(), 0);
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    const int64_t free = host_[r]->free_pages();
    // Progress is counted in physical host pages of that rank.
    if (need[r] > free) {
      target[r] = need[r] - free + l2_free_room_;
    }
  }
  EvictHostTargetsLocked(target, scope);
}

int64_t HiCacheEngine::EvictHostTargetsLocked(
    absl::Span<const int64_t> target, const EvictionScope& scope) {
  if (std::all_of(target.begin(), target.end(),
                  [](int64_t t) { return t <= 0; })) {
    return 0;
  }
  ++stats_.host_eviction_steps;
  // Under write-back a device node's host copy is redundant (its eviction
  // writes it back): such copies go first, so the tiers hold as much
  // distinct KV as they can (exclusive tiering).
  // write_ahead drops copies of device nodes too, but not those of the
  // cold end it copied ahead (accessed before write_ahead_boundary_ns_).
  const bool ahead = options_.write_policy == WritePolicy::kWriteAhead;
  HostEvictResult result = tree_->EvictHost(
      target, options_.write_policy == WritePolicy::kWriteBack || ahead,
      ahead ? write_ahead_boundary_ns_ : INT64_MIN, scope);
  stats_.host_copies_dropped += result.nodes_dropped;
  int64_t freed = 0;
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    freed += result.freed_host_pages[r].size();
  }
  FreeHostLocked(result.freed_host_pages);
  stats_.host_evicted_pages += freed;
  spdlog::debug("host eviction freed {} pages from {} nodes", freed,
                result.nodes_removed);
  return freed;
}

absl::StatusOr<std::vector<LogicalPage>> HiCacheEngine::AllocateLocked(
    absl::Span<const Rank> owners, int64_t any_lanes, PageHolder holder,
    bool may_wait, std::optional<absl::string_view> ns) {
  // More than the pool holds can never succeed: refuse before any work.
  const int64_t wanted =
      any_lanes >= 0 ? any_lanes : static_cast<int64_t>(owners.size());
  if (wanted > DevicePageCapacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(wanted, " device pages requested; the pool has ",
                     DevicePageCapacity(), " usable pages in all lanes"));
  }
  // The namespace's limit first: room under it comes from its own pages.
  if (ns.has_value()) {
    if (absl::Status s = FitDeviceQuotaLocked(*ns, wanted); !s.ok()) return s;
  }
  // Eviction for this allocation may take the namespace's own pages below
  // its guarantee, nobody else's.
  const EvictionScope scope{.requester = ns};
  auto attempt = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::vector<LogicalPage>> got =
        any_lanes >= 0 ? device_->Allocate(any_lanes)
                       : device_->AllocateWithOwners(owners);
    if (got.ok()) {
      ledger_.Add(*got, holder);
      write_ahead_allocated_ += static_cast<int64_t>(got->size());
    }
    return got;
  };
  absl::StatusOr<std::vector<LogicalPage>> pages = attempt();
  if (pages.ok() ||
      pages.status().code() != absl::StatusCode::kResourceExhausted) {
    if (pages.ok()) WriteAheadDueLocked();
    return pages;
  }
  // Evict in exactly the short lanes (any lanes for a plain allocation),
  // then retry once.
  DeviceEvictResult evicted;
  if (any_lanes >= 0) {
    const int64_t missing =
        any_lanes - device_->available() + l1_free_room_ * layout_.cp_size();
    std::vector<NodeId> held;
    if (options_.write_policy == WritePolicy::kWriteBack) {
      std::vector<int64_t> all(layout_.cp_size(), missing);
      const std::vector<uint64_t> staged =
          StageWriteBackLocked(all, &held, scope);
      if (may_wait) AwaitOpsLocked(staged);
    }
    evicted = ApplyDeviceEvictionLocked(
        tree_->EvictDeviceTokens(missing * layout_.page_size(), scope));
    ReleaseHostRefsLocked(held);
    WriteAheadDueLocked();
  } else {
    std::vector<int64_t> need(layout_.cp_size(), 0);
    for (Rank owner : owners) ++need[owner];
    evicted = EvictDeviceLocked(need, may_wait, scope);
  }
  pages = attempt();
  if (!pages.ok()) {
    ++stats_.device_alloc_failures;
    int64_t freed = 0;
    for (const auto& lane : evicted.freed_pages) freed += lane.size();
    spdlog::warn("device allocation failed after evicting {} pages: {}", freed,
                 pages.status().message());
    return absl::ResourceExhaustedError(
        absl::StrCat(pages.status().message(), "; eviction freed ", freed,
                     " pages (", evicted.nodes_to_host, " nodes to host, ",
                     evicted.nodes_removed, " removed)"));
  }
  return pages;
}

absl::StatusOr<std::vector<LogicalPage>> HiCacheEngine::Allocate(
    int64_t num_pages, uint64_t holder) {
  if (num_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_pages must be >= 0, got ", num_pages));
  }
  MutexLock lock(&mu_);
  // A copy: the allocation may release mu_ (write-back waits).
  const std::optional<std::string> ns(HolderNamespaceLocked(holder));
  return AllocateLocked({}, num_pages, PageHolder::Request(holder),
                        /*may_wait=*/true, ns);
}

absl::StatusOr<std::vector<LogicalPage>> HiCacheEngine::AllocateWithOwners(
    absl::Span<const Rank> owners, uint64_t holder) {
  MutexLock lock(&mu_);
  const std::optional<std::string> ns(HolderNamespaceLocked(holder));
  return AllocateLocked(owners, -1, PageHolder::Request(holder),
                        /*may_wait=*/true, ns);
}

int64_t HiCacheEngine::DevicePageCapacity() const {
  return (options_.device_pages_per_rank - 1) * layout_.cp_size();
}

int64_t HiCacheEngine::FreeAllOf(uint64_t holder) {
  MutexLock lock(&mu_);
  const std::vector<LogicalPage> pages = ledger_.PagesOfRequest(holder);
  ledger_.Remove(pages);
  FreeDeviceLocked(pages);
  return static_cast<int64_t>(pages.size());
}

int64_t HiCacheEngine::RequestPages(uint64_t holder) const {
  MutexLock lock(&mu_);
  return ledger_.CountOfRequest(holder);
}

int64_t HiCacheEngine::AllRequestPages() const {
  MutexLock lock(&mu_);
  return ledger_.Count(PageHolder::Kind::kRequest);
}

bool HiCacheEngine::DropNamespaceIfEmpty(absl::string_view ns) {
  MutexLock lock(&mu_);
  return tree_->DropNamespaceIfEmpty(ns);
}

absl::StatusOr<std::string> HiCacheEngine::NamespaceOf(NodeId node) const {
  MutexLock lock(&mu_);
  return tree_->NamespaceOf(node);
}

void HiCacheEngine::FreeDeviceLocked(absl::Span<const LogicalPage> pages) {
  std::vector<LogicalPage> now;
  for (LogicalPage page : pages) {
    if (!tainted_pages_.empty()) tainted_pages_.erase(page);  // Freed.
    if (busy_pages_.contains(page)) {
      free_when_idle_.insert(page);
    } else {
      now.push_back(page);
    }
  }
  absl::Status freed = device_->Free(now);
  if (!freed.ok()) {
    spdlog::error("engine freed pages it does not own: {}", freed);
  }
}

absl::Status HiCacheEngine::CheckFreeableLocked(
    absl::Span<const LogicalPage> pages, uint64_t holder) const {
  if (absl::Status s = PageLedger::CheckDistinct(pages, "pages"); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const std::optional<PageHolder> held = ledger_.HolderOf(pages[i]);
    if (held.has_value() && held->kind == PageHolder::Kind::kTree) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pages[", i, "] = ", pages[i], " is held by the radix tree"));
    }
    if (!held.has_value() || !(*held == PageHolder::Request(holder))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pages[", i, "] = ", pages[i],
          " is not held by this session (never allocated to it, or freed)"));
    }
    if (busy_pages_.contains(pages[i]) && UsedByLiveOpLocked(pages[i])) {
      return absl::FailedPreconditionError(
          absl::StrCat("pages[", i, "] = ", pages[i],
                       " is used by a backup in flight; roll it back first"));
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::Free(absl::Span<const LogicalPage> pages,
                                 uint64_t holder) {
  MutexLock lock(&mu_);
  // Validate all before freeing any; pages still copied by rolled-back ops
  // are freed when those copies finish.
  if (absl::Status s = CheckFreeableLocked(pages, holder); !s.ok()) return s;
  ledger_.Remove(pages);
  FreeDeviceLocked(pages);
  return absl::OkStatus();
}

absl::Status HiCacheEngine::CheckHeldBy(absl::Span<const LogicalPage> pages,
                                        uint64_t holder) const {
  MutexLock lock(&mu_);
  return CheckFreeableLocked(pages, holder);
}

absl::Status HiCacheEngine::CheckInsertPagesLocked(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    absl::Span<const LogicalPage> pages, uint64_t holder) {
  if (absl::Status s = PageLedger::CheckDistinct(pages, "pages"); !s.ok()) {
    return s;
  }
  const int64_t page = layout_.page_size();
  const int64_t needed = (static_cast<int64_t>(tokens.size()) + page - 1) /
                         page;
  if (static_cast<int64_t>(pages.size()) != needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("insert of ", tokens.size(), " tokens needs ", needed,
                     " pages at page size ", page, ", got ", pages.size()));
  }
  // Pages the tree holds may only be passed back where the tree holds them
  // (the matched prefix); every other page must be the caller's own.
  // The lookup runs only if a tree page was passed at all.
  std::optional<MatchResult> held;
  for (size_t i = 0; i < pages.size(); ++i) {
    const std::optional<PageHolder> owner = ledger_.HolderOf(pages[i]);
    if (owner.has_value() && *owner == PageHolder::Request(holder)) continue;
    if (!owner.has_value() || owner->kind != PageHolder::Kind::kTree) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pages[", i, "] = ", pages[i],
          " is not held by this session (nor the tree's page for these "
          "tokens)"));
    }
    if (!held.has_value()) {
      absl::StatusOr<MatchResult> match =
          tree_->MatchPrefix(ns, tokens, {.record_hit = false});
      if (!match.ok()) return match.status();
      held = *std::move(match);
    }
    if (i >= held->device_pages.size() || held->device_pages[i] != pages[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "] = ", pages[i],
                       " is held by the radix tree for other tokens",
                       DroppedLaneHintLocked(pages[i])));  // engine_lanes.cc
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::CheckInsert(absl::string_view ns,
                                        absl::Span<const int32_t> tokens,
                                        absl::Span<const LogicalPage> pages,
                                        uint64_t holder) {
  MutexLock lock(&mu_);
  return CheckInsertPagesLocked(ns, tokens, pages, holder);
}

absl::StatusOr<InsertResult> HiCacheEngine::Insert(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    absl::Span<const LogicalPage> pages, const InsertOptions& options,
    uint64_t holder) {
  MutexLock lock(&mu_);
  if (absl::Status s = CheckInsertPagesLocked(ns, tokens, pages, holder);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<InsertResult> result =
      InsertCacheableLocked(ns, tokens, pages, options);  // engine_lanes.cc
  if (!result.ok() || result->deferred) return result;
  absl::flat_hash_set<LogicalPage> not_adopted(result->duplicate_pages.begin(),
                                               result->duplicate_pages.end());
  not_adopted.insert(result->uncached_pages.begin(),
                     result->uncached_pages.end());
  std::vector<LogicalPage> adopted;
  for (LogicalPage page : pages) {
    if (!not_adopted.contains(page) &&
        ledger_.IsHeldBy(page, PageHolder::Request(holder))) {
      adopted.push_back(page);
    }
  }
  ledger_.Move(adopted, PageHolder::Tree());
  ledger_.Remove(result->released_pages);
  ledger_.Remove(result->duplicate_pages);
  FreeDeviceLocked(result->duplicate_pages);
  FreeDeviceLocked(result->released_pages);
  return result;
}

absl::Status HiCacheEngine::Lock(NodeId node) {
  if (node == kNoNode) return absl::OkStatus();
  MutexLock lock(&mu_);
  return tree_->Lock(node);
}

absl::Status HiCacheEngine::Unlock(NodeId node) {
  if (node == kNoNode) return absl::OkStatus();
  MutexLock lock(&mu_);
  absl::Status unlocked = tree_->Unlock(node);
  ReapDroppedLocked();  // A dropped node goes with its last lock.
  return unlocked;
}

absl::Status HiCacheEngine::EnforceFreeRoom() {
  MutexLock lock(&mu_);
  std::vector<int64_t> device_target(layout_.cp_size(), 0);
  std::vector<int64_t> host_target(layout_.cp_size(), 0);
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    device_target[r] = l1_free_room_ - device_->Counts(r).available();
    host_target[r] = l2_free_room_ - host_[r]->free_pages();
  }
  EvictDeviceTargetsLocked(device_target, /*may_wait=*/true);
  EvictHostTargetsLocked(host_target);
  return absl::OkStatus();
}

absl::Status HiCacheEngine::SetFreeRoom(int64_t l1_pages, int64_t l2_pages) {
  const int64_t l1_max = options_.device_pages_per_rank - 1;
  const int64_t l2_max = options_.host_pages_per_rank;
  if (l1_pages < 0 || l2_pages < 0 || l1_pages > l1_max || l2_pages > l2_max) {
    return absl::InvalidArgumentError(absl::StrCat(
        "free-room targets must be in [0, ", l1_max, "] pages per lane (L1) and [0, ",
        l2_max, "] pages per rank (L2); got ", l1_pages, " and ", l2_pages));
  }
  MutexLock lock(&mu_);
  l1_free_room_ = l1_pages;
  l2_free_room_ = l2_pages;
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> HiCacheEngine::FreeRoomTargets() const {
  MutexLock lock(&mu_);
  return {l1_free_room_, l2_free_room_};
}

absl::StatusOr<std::pair<int64_t, int64_t>> HiCacheEngine::EvictPages(
    absl::Span<const int64_t> device_per_lane,
    absl::Span<const int64_t> host_per_rank) {
  const size_t c = layout_.cp_size();
  if (device_per_lane.size() > c || host_per_rank.size() > c) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eviction targets list more than cp_size ", c, " entries"));
  }
  std::vector<int64_t> device(c, 0), host(c, 0);
  // More than a lane or rank holds means all of it (no overflow in sums).
  for (size_t i = 0; i < device_per_lane.size(); ++i) {
    if (device_per_lane[i] < 0) {
      return absl::InvalidArgumentError("eviction targets must be >= 0");
    }
    device[i] = std::min(device_per_lane[i], options_.device_pages_per_rank);
  }
  for (size_t i = 0; i < host_per_rank.size(); ++i) {
    if (host_per_rank[i] < 0) {
      return absl::InvalidArgumentError("eviction targets must be >= 0");
    }
    host[i] = std::min(host_per_rank[i], options_.host_pages_per_rank);
  }
  MutexLock lock(&mu_);
  const DeviceEvictResult evicted =
      EvictDeviceTargetsLocked(device, /*may_wait=*/true);
  int64_t device_freed = 0;
  for (const auto& lane : evicted.freed_pages) device_freed += lane.size();
  const int64_t host_freed = EvictHostTargetsLocked(host);
  return std::make_pair(device_freed, host_freed);
}

LaneCounts HiCacheEngine::LaneCountsOf(Rank lane) const {
  MutexLock lock(&mu_);
  return device_->Counts(lane);
}

EngineStats HiCacheEngine::Stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

TreeStats HiCacheEngine::TreeStatistics() const {
  MutexLock lock(&mu_);
  return tree_->Stats();
}

std::vector<NamespaceUsage> HiCacheEngine::UsageByNamespace() const {
  MutexLock lock(&mu_);
  return tree_->UsageByNamespace();
}

std::string HiCacheEngine::AccountingString() const {
  MutexLock lock(&mu_);
  std::vector<std::string> hosts;
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    hosts.push_back(
        absl::StrCat("rank ", r, ": ", host_[r]->AccountingString()));
  }
  return absl::StrCat(device_->AccountingString(), "; ",
                      absl::StrJoin(hosts, " | "));
}

int64_t HiCacheEngine::DeviceAvailable(Rank lane) const {
  MutexLock lock(&mu_);
  return device_->Counts(lane).available();
}

absl::Status HiCacheEngine::Pin(NodeId node, absl::Duration ttl) {
  MutexLock lock(&mu_);
  if (ttl == absl::ZeroDuration()) return tree_->Unpin(node);
  return tree_->Pin(node, ttl);
}

std::vector<NodeInfo> HiCacheEngine::Dump(const DumpFilter& filter) const {
  std::vector<NodeInfo> nodes;
  {
    MutexLock lock(&mu_);
    nodes = tree_->Dump(filter);
  }
  if (storage_ != nullptr) MarkStoragePages(&nodes);
  return nodes;
}

int64_t HiCacheEngine::DeviceAllocatedPages() const {
  MutexLock lock(&mu_);
  int64_t allocated = 0;
  for (Rank l = 0; l < layout_.cp_size(); ++l) {
    allocated += device_->Counts(l).allocated;
  }
  return allocated;
}

int64_t HiCacheEngine::TreeDevicePages() const {
  MutexLock lock(&mu_);
  return ledger_.Count(PageHolder::Kind::kTree);
}

int64_t HiCacheEngine::HostUsedPages(Rank rank) const {
  MutexLock lock(&mu_);
  return host_[rank]->used_pages();
}

absl::StatusOr<NodeInfo> HiCacheEngine::Inspect(NodeId node) const {
  std::vector<NodeInfo> nodes(1);
  {
    MutexLock lock(&mu_);
    absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
    if (!info.ok()) return info.status();
    nodes[0] = *std::move(info);
  }
  if (storage_ != nullptr) MarkStoragePages(&nodes);
  return nodes[0];
}

void HiCacheEngine::WaitForTransfers() {
  {
    MutexLock lock(&mu_);
    // A due write-ahead round starts copies too; the observer hears of a
    // completed step after the step stops counting as outstanding.
    while (outstanding_steps_ > 0 || write_ahead_due_ || observer_calls_ > 0) {
      idle_cv_.Wait(&mu_);
    }
  }
  // The completions' events may still be on their way to the listener
  // (dispatched after mu_ is released): deliver them, waiting for a
  // dispatcher in progress, so that the caller sees every event.
  DispatchPending();
}

}  // namespace hicache
