// HiCacheEngine: matching and holding a hit -- Match (and the counted match
// LoadBack shares, which starts the write-through backups a hit qualifies),
// Lock/Unlock and Pin of a node, and the tree's namespace lookups. Insert is
// in engine_insert.cc.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache {

absl::StatusOr<MatchResult> HiCacheEngine::Match(
    absl::string_view ns, absl::Span<const int32_t> tokens, bool peek,
    bool lock_hit, bool exact_tail) {
  MutexLock lock(&mu_);
  const MatchOptions options{
      .record_hit = !peek, .exact_tail = exact_tail, .split_at_hit = lock_hit};
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

bool HiCacheEngine::DropNamespaceIfEmpty(absl::string_view ns) {
  MutexLock lock(&mu_);
  return tree_->DropNamespaceIfEmpty(ns);
}

absl::StatusOr<std::string> HiCacheEngine::NamespaceOf(NodeId node) const {
  MutexLock lock(&mu_);
  return tree_->NamespaceOf(node);
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

absl::Status HiCacheEngine::Pin(NodeId node, absl::Duration ttl) {
  MutexLock lock(&mu_);
  if (ttl == absl::ZeroDuration()) return tree_->Unpin(node);
  return tree_->Pin(node, ttl);
}

}  // namespace hicache
