// HiCacheEngine: KV events for routers (docs/kv-events.md). The tree
// announces every tier change to EngineOptions::tier_listener by itself;
// these are the engine's calls that walk it.

#include "daemon/core/check.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache {

std::vector<HiCacheEngine::TierHit> HiCacheEngine::QueryTiers(
    absl::Span<const TierQuery> queries) {
  std::vector<TierHit> hits(queries.size());
  MutexLock lock(&mu_);
  for (size_t i = 0; i < queries.size(); ++i) {
    absl::StatusOr<MatchResult> match = tree_->MatchPrefix(
        queries[i].ns, queries[i].tokens,
        {.record_hit = false, .exact_tail = false});
    if (!match.ok()) continue;  // Only for a tree in an impossible state.
    hits[i].device_tokens = match->device_len;
    hits[i].host_tokens = match->host_hit_len;
  }
  return hits;
}

void HiCacheEngine::ReannounceNamespace(absl::string_view ns,
                                        absl::FunctionRef<void()> between) {
  MutexLock lock(&mu_);
  tree_->WithdrawAll(ns);
  between();
  tree_->AnnounceAll(ns);
}

void HiCacheEngine::ResyncTierEvents() {
  MutexLock lock(&mu_);
  tree_->ClearAnnounced();
  tree_->AnnounceAll();
}

void HiCacheEngine::DetachTierListener() {
  MutexLock lock(&mu_);
  const absl::Status detached = tree_->SetTierListener(nullptr, 0, 0);
  HICACHE_CHECK(detached.ok(), "detaching a tier listener cannot fail");
}

}  // namespace hicache
