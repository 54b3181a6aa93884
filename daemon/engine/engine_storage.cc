// HiCacheEngine: the storage tier (L3, docs/storage-tier.md). Committed host
// copies are copied to the stores; a load first promotes the pages the
// stores hold past the tree's hit to the host tier, as a host-only node,
// and then loads them like any host hit.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::Status HiCacheEngine::OpenStorageTier() {
  if (options_.storage.empty()) return absl::OkStatus();
  if (options_.storage.size() != layout_.cp_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the storage tier needs one store per CP rank: ", layout_.cp_size(),
        ", got ", options_.storage.size()));
  }
  if (pools_->layout().served_ranks().size() != layout_.cp_size()) {
    return absl::InvalidArgumentError(
        "the storage tier needs every rank's pools in this engine: a "
        "multi-daemon CP group has no storage tier yet");
  }
  for (Rank r = 0; r < options_.storage.size(); ++r) {
    const PageStore* store = options_.storage[r];
    if (store == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("no store for rank ", r));
    }
    if (store->page_bytes() != static_cast<int64_t>(geometry_.BytesPerPage())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the store of rank ", r, " holds pages of ", store->page_bytes(),
          " bytes; this layout's are ", geometry_.BytesPerPage()));
    }
  }
  storage_ = std::make_unique<StorageTier>(
      StorageTier::Options{.stores = options_.storage, .clock = options_.clock},
      layout_, geometry_, *pools_);
  for (const std::string& store : storage_->Describe()) {
    spdlog::info("storage tier: {}", store);
  }
  if (options_.storage_prefetch != PrefetchPolicy::kWaitComplete) {
    prefetcher_ = std::make_unique<StoragePrefetcher>(
        [this](absl::string_view ns, absl::Span<const int32_t> tokens) {
          return PromoteFromStorage(ns, tokens);
        },
        /*max_queued=*/256);
  }
  return absl::OkStatus();
}

// PromoteFromStorage as the prefetch policy says: in this call
// (wait_complete), or on the prefetcher's thread, waited for up to the
// timeout (timeout) or not at all (best_effort). The tokens promoted in
// time for this load.
int64_t HiCacheEngine::PromoteForLoad(absl::string_view ns,
                                      absl::Span<const int32_t> tokens) {
  if (prefetcher_ == nullptr) return PromoteFromStorage(ns, tokens);
  {
    // Only loads that have something to fetch queue one.
    MutexLock lock(&mu_);
    absl::StatusOr<MatchResult> match =
        tree_->MatchPrefix(ns, tokens, {.record_hit = false});
    if (!match.ok() || StorageHitLocked(ns, tokens, *match) == 0) return 0;
  }
  const uint64_t id = prefetcher_->Start(ns, tokens);
  if (id == 0 || options_.storage_prefetch == PrefetchPolicy::kBestEffort) {
    return 0;
  }
  return prefetcher_->Wait(id, options_.storage_prefetch_timeout).value_or(0);
}

// Copies a node's committed host copy to the storage tier (queued).
void HiCacheEngine::StoreHostCopyLocked(NodeId node) {
  absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
  std::string ns;
  absl::StatusOr<std::vector<int32_t>> path = tree_->PathTokens(node, &ns);
  if (!info.ok() || !path.ok() || info->host_pages.empty()) return;
  const int64_t page = layout_.page_size();
  absl::StatusOr<CpHostMeta> host = CpHostMeta::Create(
      info->len, page, layout_.cp_size(), info->page_owners, info->host_pages);
  if (!host.ok()) {
    spdlog::error("storage tier: node {}'s host copy: {}", node,
                  host.status().ToString());
    return;
  }
  // The node's whole pages: the last ones of its path.
  const std::vector<StoreKey> keys =
      storage_->Keys(ns, *path, info->start / page, INT64_MAX);
  if (keys.empty()) return;  // A partial page only.
  storage_->Write(*host, keys);
}

// Keys of the whole pages of `tokens` past the tree's hit in `match`
// (none when the hit ends inside a page).
std::vector<StoreKey> HiCacheEngine::ContinuationKeys(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    const MatchResult& match) const {
  const int64_t page = layout_.page_size();
  const int64_t hit = match.device_len + match.host_hit_len;
  if (hit % page != 0) return {};  // The hit ends inside a page.
  return storage_->Keys(ns, tokens, hit / page, INT64_MAX);
}

// Tokens past the tree's hit in `match` that the stores hold (whole
// pages from the hit's end, which must be a page boundary).
int64_t HiCacheEngine::StorageHitLocked(absl::string_view ns,
                                        absl::Span<const int32_t> tokens,
                                        const MatchResult& match) const {
  return static_cast<int64_t>(
             storage_->Present(ContinuationKeys(ns, tokens, match)).size()) *
         layout_.page_size();
}

// Sets each node's storage_pages: how many of its whole pages the stores
// hold (DumpTree, Inspect). Asks the stores without the engine lock.
void HiCacheEngine::MarkStoragePages(std::vector<NodeInfo>* nodes) const {
  const int64_t page = layout_.page_size();
  // Under the lock, each node's whole pages' keys; then the stores.
  std::vector<std::vector<StoreKey>> keys(nodes->size());
  {
    MutexLock lock(&mu_);
    for (size_t n = 0; n < nodes->size(); ++n) {
      std::string ns;
      absl::StatusOr<std::vector<int32_t>> path =
          tree_->PathTokens((*nodes)[n].id, &ns);
      if (!path.ok()) continue;  // Gone since the dump.
      keys[n] = storage_->Keys(ns, *path, (*nodes)[n].start / page, INT64_MAX);
    }
  }
  // One question per store for the whole dump.
  std::vector<StoreKey> all;
  for (const std::vector<StoreKey>& k : keys)
    all.insert(all.end(), k.begin(), k.end());
  const std::vector<int> holders = storage_->Holders(all);
  size_t at = 0;
  for (size_t n = 0; n < nodes->size(); ++n) {
    const auto begin = holders.begin() + at;
    at += keys[n].size();
    (*nodes)[n].storage_pages = std::count_if(
        begin, holders.begin() + at, [](int holder) { return holder >= 0; });
  }
}

// The cost model: whether reading `pages` pages from the stores (at the
// measured cost) is no slower than recomputing their tokens.
bool HiCacheEngine::LoadBeatsRecomputeLocked(int64_t pages) const {
  const int64_t per_token = options_.storage_recompute_ns_per_token;
  const double ns_per_byte = storage_->ReadNsPerByte();
  if (per_token <= 0 || ns_per_byte <= 0) return true;  // Off, or unmeasured.
  const double read_ns = ns_per_byte * static_cast<double>(pages) *
                         static_cast<double>(geometry_.BytesPerPage());
  const double recompute_ns = static_cast<double>(per_token) *
                              static_cast<double>(pages) * layout_.page_size();
  return read_ns <= recompute_ns;
}

StorageTierReport HiCacheEngine::StorageReport() const {
  StorageTierReport r;
  if (storage_ == nullptr) return r;
  r.enabled = true;
  r.stores = storage_->Describe();
  const StorageTier::Stats t = storage_->stats();
  const PageStoreStats s = storage_->StoreStats();
  r.capacity_pages = s.capacity_pages;
  r.used_pages = s.used_pages;
  r.pages_queued = t.pages_queued;
  r.pages_dropped = t.pages_dropped;
  r.pages_written = t.pages_written;
  r.write_errors = t.write_errors;
  r.pages_read = t.pages_read;
  r.read_failures = t.read_failures;
  r.checksum_failures = s.checksum_failures;
  r.evictions = s.evictions;
  r.bytes_written = s.put_bytes;
  r.bytes_read = s.get_bytes;
  r.read_ns_per_byte = storage_->ReadNsPerByte();
  if (prefetcher_ != nullptr) {
    const StoragePrefetcher::Stats p = prefetcher_->stats();
    r.prefetches_started = p.started;
    r.prefetches_dropped = p.dropped;
    r.prefetch_waits_timed_out = p.waits_timed_out;
  }
  return r;
}

// Reads the pages the stores hold past the tree's hit on `tokens` into
// host pages and attaches them as a host-only node there (the engine lock
// is released for the reads). Returns the tokens promoted.
int64_t HiCacheEngine::PromoteFromStorage(absl::string_view ns,
                                          absl::Span<const int32_t> tokens) {
  const int64_t page = layout_.page_size();
  NodeId parent = kNoNode;
  bool parent_held = false;
  int64_t first = 0;  // The first page past the tree's hit.
  std::vector<StoreKey> keys;
  std::vector<Rank> sources, owners;
  std::vector<std::vector<int64_t>> host;
  {
    MutexLock lock(&mu_);
    // Where the tree's hit ends, split there so a node ends at it.
    absl::StatusOr<MatchResult> match = tree_->MatchPrefix(
        ns, tokens, {.record_hit = false, .split_at_hit = true});
    if (!match.ok()) return 0;
    const int64_t hit = match->device_len + match->host_hit_len;
    keys = ContinuationKeys(ns, tokens, *match);
    if (keys.empty() || AnyLaneDownLocked()) return 0;
    ++stats_.storage_lookups;
    first = hit / page;
    sources = storage_->Present(keys);
    if (sources.empty()) return 0;
    stats_.storage_hit_pages += static_cast<int64_t>(sources.size());
    parent = match->host_hit_len > 0 ? match->last_host_node
                                     : match->last_device_node;
    absl::StatusOr<NodeInfo> info = tree_->Inspect(parent);
    if (info.ok() && info->depth == 0) parent = kNoNode;  // The root.
    if (parent != kNoNode) {
      const bool has_host = info.ok() && (info->tier == NodeTier::kHost ||
                                          info->tier == NodeTier::kBoth);
      // The new node must hang from the hit's end, and under a
      // prefix-closed host tier from a host copy.
      if (!info.ok() || info->start + info->len != hit ||
          (tree_->options().prefix_closed_host && !has_host)) {
        ++stats_.storage_promotions_skipped;
        return 0;
      }
      // Keep the parent's host copy while the lock is released.
      parent_held = has_host && tree_->AddHostRef(parent).ok();
    }
    // At most a quarter of the host tier per promotion.
    const int64_t cap = std::max<int64_t>(
        1, options_.host_pages_per_rank * layout_.cp_size() / 4);
    const int64_t n = std::min<int64_t>(sources.size(), cap);
    // The cost model: reading n pages at the measured cost against
    // recomputing their tokens.
    if (!LoadBeatsRecomputeLocked(n)) {
      if (parent_held) (void)tree_->ReleaseHostRef(parent);
      ++stats_.storage_refused_cost;
      return 0;
    }
    keys.resize(n);
    sources.resize(n);
    // Each rank reads only its own store into its own host pool: a page
    // found in rank r's store is owned by r. One store shared by every rank
    // (a shared tier) assigns the owners by position.
    const bool shared =
        std::all_of(options_.storage.begin(), options_.storage.end(),
                    [&](PageStore* s) { return s == options_.storage[0]; });
    for (int64_t i = 0; i < n; ++i) {
      owners.push_back(shared
                           ? static_cast<Rank>((first + i) % layout_.cp_size())
                           : sources[i]);
    }
    std::vector<int64_t> need(layout_.cp_size(), 0);
    for (Rank r : owners) ++need[r];
    EvictHostLocked(need, {.requester = std::string(ns)});
    if (!ReserveHostLocked(owners, &host).ok()) {
      if (parent_held) (void)tree_->ReleaseHostRef(parent);
      ReapDroppedLocked();
      ++stats_.storage_promotions_skipped;
      return 0;
    }
  }
  // The reads, without the lock: the reserved pages are this call's alone.
  std::vector<int64_t> pages;
  {
    std::vector<size_t> next(layout_.cp_size(), 0);
    for (Rank r : owners) pages.push_back(host[r][next[r]++]);
  }
  const int64_t intact = storage_->Read(keys, sources, owners, pages);
  MutexLock lock(&mu_);
  if (parent_held) (void)tree_->ReleaseHostRef(parent);
  // Keep the pages of the intact run; free the rest.
  std::vector<std::vector<int64_t>> kept(layout_.cp_size()),
      unused(layout_.cp_size());
  for (int64_t i = 0; i < static_cast<int64_t>(owners.size()); ++i) {
    (i < intact ? kept : unused)[owners[i]].push_back(pages[i]);
  }
  FreeHostLocked(unused);
  absl::StatusOr<NodeId> attached = absl::NotFoundError("nothing read");
  if (intact > 0) {
    absl::StatusOr<CpHostMeta> meta = CpHostMeta::Create(
        intact * page, page, layout_.cp_size(),
        std::vector<Rank>(owners.begin(), owners.begin() + intact), kept);
    attached =
        meta.ok() ? tree_->AttachHostNode(
                        ns, parent, tokens.subspan(first * page, intact * page),
                        *std::move(meta))
                  : meta.status();
  }
  if (!attached.ok()) {
    FreeHostLocked(kept);
    ++stats_.storage_promotions_failed;
    spdlog::debug("storage tier: promotion of {} pages not attached: {}",
                  intact, attached.status().ToString());
    ReapDroppedLocked();
    return 0;
  }
  stats_.storage_promoted_pages += intact;
  ReapDroppedLocked();
  return intact * page;
}

}  // namespace hicache
