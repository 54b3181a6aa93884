// HiCacheEngine: the backups a write policy starts by itself -- write-through
// at a hit, write-back of eviction victims and write-ahead of the cold end,
// all asynchronous and attached at once -- as opposed to the per-layer
// backups a scheduler prepares for a forward pass (engine_ops.cc), and which
// of those the write policy asks Admit for (BacksUpAtAdmit).
#include <algorithm>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

uint64_t HiCacheEngine::StartBackupOfNodeLocked(NodeId node,
                                                bool write_back) {
  absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
  if (!info.ok() || info->tier != NodeTier::kDevice || info->pending_backup) {
    return 0;
  }
  if (BackupBlockedByLanesLocked(info->device_pages)) return 0;
  auto op = std::make_unique<Op>();
  op->kind = Op::Kind::kBackup;
  op->state = InitialOpState(OpKind::kBackup, /*attached=*/true);
  op->write_back = write_back;
  op->pages = info->device_pages;
  op->owners = layout_.OwnersOf(op->pages);
  op->logical_len = info->len;
  std::vector<int64_t> need(layout_.cp_size(), 0);
  for (Rank owner : op->owners) ++need[owner];
  // Its namespace's host limit first (quotas only): room under it comes
  // from the namespace's own copies.
  const std::optional<std::string> ns = QuotaNamespaceOfLocked(node);
  if (ns.has_value() && !FitHostQuotaLocked(*ns, need).ok()) {
    ++stats_.backups_skipped_quota;
    return 0;
  }
  EvictHostLocked(need, {.requester = ns});
  if (!ReserveHostLocked(op->owners, &op->host).ok()) {
    ++stats_.backups_skipped_no_host;
    return 0;
  }
  absl::StatusOr<CpHostMeta> meta =
      CpHostMeta::Create(op->logical_len, layout_.page_size(),
                         layout_.cp_size(), op->owners, op->host);
  if (!meta.ok() || !tree_->BeginBackup(node, *std::move(meta)).ok()) {
    FreeHostLocked(op->host);
    return 0;
  }
  op->id = next_op_++;
  op->node = node;
  op->submitted.assign(geometry_.NumSteps(), true);
  op->submit_ns = absl::GetCurrentTimeNanos();
  AcquirePagesLocked(op->pages);
  ++stats_.backups_started;
  const uint64_t id = op->id;
  Op& ref = *op;
  ops_[id] = std::move(op);
  for (uint32_t step = 0; step < geometry_.NumSteps(); ++step) {
    if (absl::Status s = SubmitStepLocked(ref, step); !s.ok()) {
      // Nothing of this step will complete: the backup can never commit.
      spdlog::error("{} submit of node {} failed at step {}: {}",
                    write_back ? "write-back" : "write-through", node, step,
                    s);
      FailOpLocked(ref, 0, step, s);
      if (ref.outstanding == 0) {  // Else the last completion finishes it.
        std::vector<OpEvent> events;
        FinishOpLocked(id, &events);
        event_queue_.insert(event_queue_.end(), events.begin(), events.end());
      }
      return 0;
    }
  }
  return id;
}

void HiCacheEngine::ReleaseHostRefsLocked(absl::Span<const NodeId> held) {
  for (NodeId node : held) {
    if (auto it = write_back_host_refs_.find(node);
        it != write_back_host_refs_.end() && --it->second == 0) {
      write_back_host_refs_.erase(it);
    }
    // The node cannot be gone: no eviction removes a node with a host
    // reference (RadixTree::EvictDevice keeps an unbacked victim whose
    // host-only descendant is referenced). An error here is a bug.
    if (absl::Status s = tree_->ReleaseHostRef(node); !s.ok()) {
      spdlog::error("write-back: releasing the host reference of node {}: {}",
                    node, s);
    }
  }
  ReapDroppedLocked();  // A node dropped with its lanes meanwhile goes now.
}

// Write-back: starts asynchronous backups of unbacked device victims, in
// eviction order, until they cover `need` per lane; returns the ops
// (started now or already in flight). Their device pages stay allocated
// until the copies complete and a later eviction moves the nodes to host.
// A victim that would need host room taken from a more frequent host
// node is not staged (RadixTree::AdmitToHost): it is evicted uncopied.
// Victims that already have a host copy get a host reference (appended to
// `held`), so that no host eviction drops that copy before the device
// eviction that relies on it; the caller releases them after it
// (ReleaseHostRefsLocked).
std::vector<uint64_t> HiCacheEngine::StageWriteBackLocked(
    absl::Span<const int64_t> need, std::vector<NodeId>* held,
    const EvictionScope& scope) {
  std::vector<uint64_t> staged;
  std::vector<int64_t> covered(layout_.cp_size(), 0);
  auto short_lane = [&] {
    for (Rank l = 0; l < layout_.cp_size(); ++l) {
      if (covered[l] < need[l]) return true;
    }
    return false;
  };
  // Admission: a victim is demoted only if it would not displace a more
  // frequent host node; read once for the batch, and only when a victim
  // does not fit the free host pages.
  absl::flat_hash_map<std::string, int> host_victim_classes;
  std::vector<int64_t> host_free(layout_.cp_size());
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    host_free[r] = host_[r]->free_pages();
  }
  // Victims of other lanes come in between: list up to every lane's need
  // times the lanes.
  int64_t total_need = 0;
  for (int64_t n : need) total_need += std::max<int64_t>(n, 0);
  std::vector<NodeId> to_copy;
  std::map<std::string, std::vector<int64_t>> host_need;
  for (NodeId node : tree_->DeviceEvictionOrder(
           1 << 20, total_need * static_cast<int64_t>(layout_.cp_size()),
           scope)) {
    if (!short_lane()) break;
    absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
    if (!info.ok()) continue;
    std::vector<int64_t> pages(layout_.cp_size(), 0);
    for (LogicalPage p : info->device_pages) ++pages[layout_.LaneOf(p)];
    for (Rank l = 0; l < layout_.cp_size(); ++l) covered[l] += pages[l];
    if (info->tier == NodeTier::kBoth) {  // Already backed: keep it so.
      if (tree_->AddHostRef(node).ok()) {
        held->push_back(node);
        ++write_back_host_refs_[node];
      }
      continue;
    }
    if (info->pending_backup) {
      // In flight already (write-through or an earlier write-back): wait
      // for that one too.
      for (const auto& [id, op] : ops_) {
        if (op->kind == Op::Kind::kBackup &&
            op->state == OpState::kAttached && op->node == node) {
          staged.push_back(id);
        }
      }
      continue;
    }
    if (!AdmitVictimLocked(node, pages, host_free, &host_victim_classes)) {
      continue;  // Evicted without a copy.
    }
    for (Rank r = 0; r < layout_.cp_size(); ++r) {
      host_free[r] = std::max<int64_t>(0, host_free[r] - pages[r]);
    }
    AddHostNeedLocked(node, pages, &host_need);
    to_copy.push_back(node);
  }
  // One host eviction for the batch (each backup then finds its room).
  EvictHostForBatchLocked(host_need);
  for (NodeId node : to_copy) {
    if (const uint64_t id = StartBackupOfNodeLocked(node, /*write_back=*/true);
        id != 0) {
      staged.push_back(id);
    }
  }
  return staged;
}

// Admission of a device victim to the host tier (write_back's staging and
// write_ahead's leaves): true when its pages (per rank) fit `host_free`,
// or when it would displace no more frequent host node
// (RadixTree::AdmitToHost; the victim class is read once per batch and
// namespace into `host_victim_classes`: with quotas, what eviction for
// the node's namespace could take). A refusal counts in
// write_back_rejected.
bool HiCacheEngine::AdmitVictimLocked(
    NodeId node, absl::Span<const int64_t> pages,
    absl::Span<const int64_t> host_free,
    absl::flat_hash_map<std::string, int>* host_victim_classes) {
  bool fits = true;
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    fits &= pages[r] <= host_free[r];
  }
  if (fits) return true;
  // With quotas: what eviction for the node's namespace could take.
  const std::optional<std::string> ns = QuotaNamespaceOfLocked(node);
  auto [it, added] = host_victim_classes->try_emplace(ns.value_or(""), 0);
  if (added) {
    it->second = tree_->HostVictimClass(/*redundant_first=*/true,
                                        {.requester = ns});
  }
  if (tree_->AdmitToHost(node, it->second)) return true;
  ++stats_.write_back_rejected;
  return false;
}

// A batch's host eviction (write-back staging, a write-ahead round):
// `need` per rank of copies of `node` added to `by_ns` (by namespace with
// quotas, else all under ""), then one eviction making the batch's room,
// run for each namespace in turn as its requester.
void HiCacheEngine::AddHostNeedLocked(
    NodeId node, absl::Span<const int64_t> need,
    std::map<std::string, std::vector<int64_t>>* by_ns) {
  std::vector<int64_t>& mine =
      (*by_ns)[QuotaNamespaceOfLocked(node).value_or("")];
  mine.resize(layout_.cp_size(), 0);
  for (Rank r = 0; r < layout_.cp_size(); ++r) mine[r] += need[r];
}

void HiCacheEngine::EvictHostForBatchLocked(
    const std::map<std::string, std::vector<int64_t>>& by_ns) {
  if (by_ns.empty()) return;
  if (quotas_.empty()) {  // One entry: "".
    EvictHostLocked(by_ns.begin()->second);
    return;
  }
  // Each namespace in turn makes room for its own copies on top of those
  // before it, as their requester (so a guarantee spares only what others
  // need: docs/quotas.md).
  std::vector<int64_t> cumulative(layout_.cp_size(), 0);
  for (const auto& [ns, need] : by_ns) {
    for (Rank r = 0; r < layout_.cp_size(); ++r) cumulative[r] += need[r];
    EvictHostLocked(cumulative, {.requester = ns});
  }
}

bool HiCacheEngine::HostCopyCanJoin(NodeId parent) const {
  MutexLock lock(&mu_);
  return tree_->HostCopyCanJoinBelow(parent);
}

bool HiCacheEngine::BacksUpAtAdmit(NodeId parent,
                                   absl::Span<const LogicalPage> pages) const {
  switch (options_.write_policy) {
    case WritePolicy::kWriteThrough:
      return true;
    case WritePolicy::kWriteAhead: {
      std::vector<int64_t> need(layout_.cp_size(), 0);
      for (LogicalPage p : pages) ++need[layout_.LaneOf(p)];
      MutexLock lock(&mu_);
      if (!tree_->HostCopyCanJoinBelow(parent)) return false;
      for (Rank r = 0; r < layout_.cp_size(); ++r) {
        if (need[r] > 0 && host_[r]->free_pages() - l2_free_room_ < need[r]) {
          return false;
        }
      }
      return true;
    }
    case WritePolicy::kWriteThroughSelective:
    case WritePolicy::kWriteBack:
      return false;
  }
  return false;
}

// Asks write-ahead's thread for a round (write_ahead only; no-op
// otherwise): the allocation or eviction that made one due returns
// without it, and the round runs while the request's forward does.
// Without the thread (EngineOptions::write_ahead_thread) it runs the
// round at once.
void HiCacheEngine::WriteAheadDueLocked() {
  if (options_.write_policy != WritePolicy::kWriteAhead) return;
  if (!options_.write_ahead_thread) {
    WriteAheadLocked();
    return;
  }
  if (write_ahead_due_) return;
  write_ahead_due_ = true;
  write_ahead_cv_.Signal();
}

void HiCacheEngine::WriteAheadLoop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      while (!write_ahead_due_ && !write_ahead_stop_) {
        write_ahead_cv_.Wait(&mu_);
      }
      if (write_ahead_stop_) return;
      write_ahead_due_ = false;
      WriteAheadLocked();  // In the same critical section: done when seen.
      idle_cv_.SignalAll();  // WaitForTransfers waits for the round.
    }
    DispatchPending();  // A copy that failed to start ended with events.
  }
}

// Write-ahead (WritePolicy::kWriteAhead): when the device tier is within
// a window of full, starts backups (asynchronous, never waited for) of the
// coldest device nodes without a host copy, in eviction order, until the
// window's worth of cold pages has a copy or one in flight. The host tier
// is prefix-closed: a node whose parent has no copy yet gets its topmost
// uncopied ancestor backed first (the node itself in a later round). A
// leaf that would need host room taken from a more frequent host node is
// not copied (admission): eviction then drops it. One host eviction makes
// room for the round's copies. Called after allocations and evictions; it
// scans again only once 1/16 of the window has been allocated since its
// last scan.
void HiCacheEngine::WriteAheadLocked() {
  const int64_t window = std::max<int64_t>(
      DevicePageCapacity() / 16, 4 * l1_free_room_ * layout_.cp_size());
  if (device_->available() > window) {  // Far from full: nothing yet.
    write_ahead_scanned_ = false;
    return;
  }
  // The cold end moves as pages are taken: rescan once a sixteenth of the
  // window has been allocated since the last scan, not after every
  // allocation (each scan walks the device tier).
  if (write_ahead_scanned_ && write_ahead_allocated_ < window / 16) return;
  write_ahead_scanned_ = true;
  write_ahead_allocated_ = 0;
  write_ahead_boundary_ns_ = INT64_MIN;
  absl::flat_hash_map<std::string, int> host_victim_classes;
  int64_t covered = 0;
  absl::flat_hash_set<NodeId> started;
  std::vector<NodeId> to_copy;
  std::map<std::string, std::vector<int64_t>> host_need;
  std::vector<int64_t> host_free(layout_.cp_size());
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    host_free[r] = host_[r]->free_pages();
  }
  for (const ColdNode& cold : tree_->DeviceColdEnd(window)) {
    if (covered >= window) break;
    covered += cold.device_pages;
    write_ahead_boundary_ns_ =
        std::max(write_ahead_boundary_ns_, cold.last_access_ns);
    const NodeId target = cold.copy_target;
    if (target == kNoNode || !started.insert(target).second) continue;
    absl::StatusOr<std::vector<int64_t>> pages =
        tree_->DevicePagesPerLane(target);
    if (!pages.ok()) continue;
    // Admission, for a leaf of the cold end (an ancestor is admitted: the
    // closure needs it).
    if (target == cold.node &&
        !AdmitVictimLocked(target, *pages, host_free, &host_victim_classes)) {
      continue;
    }
    for (Rank r = 0; r < layout_.cp_size(); ++r) {
      host_free[r] = std::max<int64_t>(0, host_free[r] - (*pages)[r]);
    }
    AddHostNeedLocked(target, *pages, &host_need);
    to_copy.push_back(target);
  }
  // One host eviction for the round (each backup then finds its room).
  EvictHostForBatchLocked(host_need);
  for (NodeId node : to_copy) {
    if (StartBackupOfNodeLocked(node, /*write_back=*/true) != 0) {
      ++stats_.write_ahead_backups;
    }
  }
}

void HiCacheEngine::AwaitOpsLocked(absl::Span<const uint64_t> ops) {
  if (ops.empty()) return;
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (uint64_t id : ops) {
      auto it = ops_.find(id);
      if (it == ops_.end()) continue;
      const Op& op = *it->second;
      // Ended, and no copy still reads its pages (a failed backup's other
      // steps may still run; its pages are freed only after them).
      if (OpInFlight(op.state)) return false;
      if (op.outstanding > 0) return false;
    }
    return true;
  };
  if (!settled()) ++stats_.copy_waits;
  const absl::Time deadline = absl::Now() + options_.write_back_wait;
  while (!settled()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration() || ops_cv_.WaitWithTimeout(&mu_, left)) {
      if (settled()) return;
      spdlog::warn("write-back: {} staged victims still copying after {}; "
                   "evicting without them",
                   ops.size(), absl::FormatDuration(options_.write_back_wait));
      return;
    }
  }
}

}  // namespace hicache
