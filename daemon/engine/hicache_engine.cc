// HiCacheEngine: creation (Create, the constructor and destructor), the
// listener, worker fences, WaitForTransfers and LoadMissReasonName. The
// other members are in engine_<concept>.cc: match, insert, allocation,
// eviction, introspection, ops (backups, completions), layer_store, load,
// write_policy, failures, lanes, quotas, storage, persistence, tier_events.
#include "daemon/engine/hicache_engine.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine_op.h"
#include "daemon/backend/cpu/cpu_backend.h"

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
