// HiCacheEngine: load-back of host-only nodes (LoadBack, its completion,
// LoadDone and FinishLoad). Backups and transfer completions are in
// engine_ops.cc.
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

namespace {
int64_t NowNs() { return absl::GetCurrentTimeNanos(); }
}  // namespace

absl::StatusOr<LoadResult> HiCacheEngine::LoadBack(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    const LoadBackOptions& load_options) {
  const int64_t promoted =
      storage_ != nullptr && load_options.extend_tokens >= 0
          ? PromoteForLoad(ns, tokens)
          : 0;
  absl::StatusOr<LoadResult> result =
      LoadBackFromHost(ns, tokens, load_options);
  if (result.ok()) result->storage_len = std::min(promoted, result->loaded_len);
  return result;
}

absl::StatusOr<LoadResult> HiCacheEngine::LoadBackFromHost(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    const LoadBackOptions& load_options) {
  if (load_options.extend_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extend_tokens must be >= 0, got ", load_options.extend_tokens));
  }
  MutexLock lock(&mu_);
  // The hit is locked whatever happens: a lock covers only the hit.
  absl::StatusOr<MatchResult> match = CountedMatchLocked(
      ns, tokens,
      {.exact_tail = load_options.exact_tail, .split_at_hit = true});
  if (!match.ok()) return match.status();
  LoadResult result;
  result.device_len = match->device_len;
  result.pages = match->device_pages;
  result.node = match->last_device_node;
  // Without a load, the device hit is locked for the caller right away.
  auto device_only = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    (void)tree_->Lock(result.node);
    return result;
  };
  if (match->host_hit_len == 0) return device_only();
  auto miss = [&](LoadMissReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++stats_.load_misses;
    result.miss = reason;
    if (reason == LoadMissReason::kLaneUnavailable) {
      ++stats_.load_misses_lane_unavailable;
    }
    return device_only();
  };
  // A lane is unavailable (engine_lanes.cc): no load starts.
  if (AnyLaneDownLocked()) return miss(LoadMissReason::kLaneUnavailable);
  absl::StatusOr<std::vector<NodeId>> chain =
      tree_->HostOnlyChain(match->last_host_node);
  if (!chain.ok()) return chain.status();
  std::vector<Rank> owners;
  std::vector<std::pair<NodeId, int64_t>> slices;
  std::vector<std::vector<int64_t>> host(layout_.cp_size());
  int64_t logical_len = 0;
  for (NodeId id : *chain) {
    const NodeInfo info = *tree_->Inspect(id);
    if (info.host_ref > 0) return miss(LoadMissReason::kLoadInFlight);
    logical_len += info.len;
    owners.insert(owners.end(), info.page_owners.begin(),
                  info.page_owners.end());
    slices.push_back({id, static_cast<int64_t>(info.page_owners.size())});
    for (Rank r = 0; r < layout_.cp_size(); ++r) {
      host[r].insert(host[r].end(), info.host_pages[r].begin(),
                     info.host_pages[r].end());
    }
  }
  if (logical_len < options_.load_back_threshold_tokens) {
    return miss(LoadMissReason::kBelowThreshold);
  }
  // The parent of the chain must stay on device while the copies run:
  // locked first, so that the quota below no longer counts the request's
  // own device prefix as room (seed 000: the quota plus the lock's delta).
  const NodeId parent = match->last_device_node;
  (void)tree_->Lock(parent);
  // Quota: free device pages plus what eviction could free must cover the
  // load and, when the caller says how long its extend is, the extend plus
  // one page (seed 000: the load must not starve its own request).
  const int64_t page = layout_.page_size();
  const int64_t evictable_pages = tree_->Stats().evictable_tokens / page;
  const int64_t extend_pages =
      load_options.extend_tokens > 0
          ? (load_options.extend_tokens + page - 1) / page + 1
          : 0;
  if (static_cast<int64_t>(owners.size()) + extend_pages >
      device_->available() + evictable_pages) {
    (void)tree_->Unlock(parent);  // miss() locks the hit for the caller.
    return miss(LoadMissReason::kOverQuota);
  }
  // Protect the host copies before anything can evict.
  for (const auto& [node, count] : slices) (void)tree_->AddHostRef(node);
  // The namespace's device limit (docs/quotas.md): room under it comes
  // from the namespace's own unlocked nodes, else the load is a miss.
  if (!FitDeviceQuotaLocked(ns, static_cast<int64_t>(owners.size())).ok()) {
    for (const auto& [node, count] : slices) (void)tree_->ReleaseHostRef(node);
    (void)tree_->Unlock(parent);
    ReapDroppedLocked();
    return miss(LoadMissReason::kNamespaceQuota);
  }
  // Exactly the recorded owners; owner-lane-targeted eviction on shortage;
  // never a plain allocation. Under write-back the allocation may wait (mu_
  // released) for the victims it writes back -- else it would evict other,
  // uncopied nodes in their place. What this call read before is safe to
  // use after: the chain's host copies carry host references (never
  // evicted, dropped or split meanwhile) and the device hit is locked.
  const uint64_t op_id = next_op_++;
  absl::StatusOr<std::vector<LogicalPage>> pages =
      AllocateLocked(owners, -1, PageHolder::Load(op_id), /*may_wait=*/true,
                     ns);
  // The allocation may have waited (mu_ released) while lanes went down.
  bool lanes_lost = AnyLaneDownLocked() || tree_->IsDetached(parent);
  for (const auto& [node, count] : slices) {
    lanes_lost |= tree_->IsDetached(node);
  }
  if (!pages.ok() || lanes_lost) {
    if (pages.ok()) {
      ledger_.Remove(*pages);
      FreeDeviceLocked(*pages);
    }
    for (const auto& [node, count] : slices) (void)tree_->ReleaseHostRef(node);
    (void)tree_->Unlock(parent);
    if (tree_->IsDetached(parent)) {  // The device hit was dropped too.
      result.device_len = 0;
      result.pages.clear();
      result.node = kNoNode;
    }
    ReapDroppedLocked();
    return miss(lanes_lost ? LoadMissReason::kLaneUnavailable
                           : LoadMissReason::kNoDeviceMemory);
  }
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kLoad;
  op->state = InitialOpState(OpKind::kLoad);
  op->id = op_id;
  op->pages = *pages;
  op->owners = owners;
  op->logical_len = logical_len;
  op->host = host;
  op->chain = slices;
  op->node = chain->back();
  op->locked_parent = parent;
  op->submitted.assign(geometry_.NumSteps(), true);
  op->submit_ns = NowNs();
  AcquirePagesLocked(op->pages);
  ++stats_.loads_started;
  result.op_id = op->id;
  result.loaded_len = match->host_hit_len;
  result.num_steps = geometry_.NumSteps();
  result.node = op->node;
  // Only valid-token locations reach the caller.
  const int64_t valid_pages =
      (match->device_len + match->host_hit_len + layout_.page_size() - 1) /
          layout_.page_size() -
      static_cast<int64_t>(match->device_pages.size());
  result.pages.insert(result.pages.end(), op->pages.begin(),
                      op->pages.begin() + valid_pages);
  Op& ref = *op;
  ops_[op->id] = std::move(op);
  for (uint32_t step = 0; step < geometry_.NumSteps(); ++step) {
    if (absl::Status s = SubmitStepLocked(ref, step); !s.ok()) {
      spdlog::error("load submit failed: {}", s);
      if (ref.state != OpState::kLoadAbandoned) {
        AdvanceOpLocked(ref, OpTrigger::kRollback);
      }
    }
  }
  if (ref.state == OpState::kLoadAbandoned && ref.outstanding == 0) {
    std::vector<OpEvent> ignored;
    FinishOpLocked(ref.id, &ignored);
    result.op_id = 0;
    result.node = parent;
    result.pages = match->device_pages;
    result.loaded_len = 0;
    return miss(LoadMissReason::kNoDeviceMemory);
  }
  return result;
}

void HiCacheEngine::CompleteLoadLocked(Op& op,
                                       std::vector<OpEvent>* events) {
  size_t offset = 0;
  bool ok = true;
  for (const auto& [node, count] : op.chain) {
    absl::Span<const LogicalPage> slice(op.pages.data() + offset, count);
    offset += count;
    if (ok) {
      absl::Status attached = tree_->AttachDevicePages(node, slice);
      if (!attached.ok()) {
        spdlog::warn("load {}: attaching node {} failed: {}", op.id, node,
                     attached);
        ok = false;
        const absl::Span<const LogicalPage> rest(
            op.pages.data() + offset - count, op.pages.size() - offset + count);
        ledger_.Remove(rest);
        FreeDeviceLocked(rest);
      } else {
        ledger_.Move(slice, PageHolder::Tree());
      }
    }
    (void)tree_->ReleaseHostRef(node);
  }
  if (ok) {
    (void)tree_->Lock(op.node);  // Held for the caller until FinishLoad.
    ++stats_.loads_done;
  }
  (void)tree_->Unlock(op.locked_parent);
  op.locked_parent = kNoNode;
  AdvanceOpLocked(op, ok ? OpTrigger::kLoadAttached
                         : OpTrigger::kLoadAttachFailed);
  ReleasePagesLocked(op.pages);
  op.pages.clear();
  events->push_back(OpEvent::LoadDone(op.id, ok));
}

absl::StatusOr<bool> HiCacheEngine::LoadDone(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = ops_.find(id);
  if (it == ops_.end() || it->second->kind != Op::Kind::kLoad) {
    return absl::NotFoundError(absl::StrCat("no load with op id ", id));
  }
  const OpState state = it->second->state;
  if (OpFailed(state)) {
    return absl::AbortedError(absl::StrCat(
        "load ", id, " failed; its locations are not valid (a miss)"));
  }
  return state == OpState::kLoaded;
}

absl::Status HiCacheEngine::FinishLoad(uint64_t id) {
  std::vector<OpEvent> events;
  {
    MutexLock lock(&mu_);
    auto it = ops_.find(id);
    if (it == ops_.end() || it->second->kind != Op::Kind::kLoad) {
      return absl::NotFoundError(absl::StrCat("no load with op id ", id));
    }
    Op& op = *it->second;
    if (op.state == OpState::kLoaded) {
      (void)tree_->Unlock(op.node);
      AdvanceOpLocked(op, OpTrigger::kFinish);
      ops_.erase(it);
    } else if (op.state == OpState::kLoadFailed) {
      ReleaseFailedLoadLocked(id);
    } else {
      // Pages are freed when the copies finish.
      AdvanceOpLocked(op, OpTrigger::kRollback);
      if (op.outstanding == 0) FinishOpLocked(id, &events);
    }
    ReapDroppedLocked();  // Its node may have been dropped meanwhile.
    event_queue_.insert(event_queue_.end(), events.begin(), events.end());
  }
  DispatchPending();
  return absl::OkStatus();
}

}  // namespace hicache
