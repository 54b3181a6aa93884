// HiCacheEngine: backups and transfer completions (load-back: engine_load.cc).
#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/core/check.h"
#include "daemon/engine/engine_op.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

namespace {
int64_t NowNs() { return absl::GetCurrentTimeNanos(); }
}  // namespace

bool HiCacheEngine::UsedByLiveOpLocked(LogicalPage page) const {
  for (const auto& [id, op] : ops_) {
    if (OpGivenUp(op->state)) continue;
    if (std::find(op->pages.begin(), op->pages.end(), page) !=
        op->pages.end()) {
      return true;
    }
  }
  return false;
}

void HiCacheEngine::AcquirePagesLocked(absl::Span<const LogicalPage> pages) {
  for (LogicalPage page : pages) ++busy_pages_[page];
}

void HiCacheEngine::ReleasePagesLocked(absl::Span<const LogicalPage> pages) {
  std::vector<LogicalPage> now_free;
  for (LogicalPage page : pages) {
    auto it = busy_pages_.find(page);
    if (--it->second > 0) continue;
    busy_pages_.erase(it);
    if (free_when_idle_.erase(page) > 0) now_free.push_back(page);
  }
  if (!now_free.empty()) FreeDeviceLocked(now_free);
}

absl::Status HiCacheEngine::ReserveHostLocked(
    absl::Span<const Rank> owners, std::vector<std::vector<int64_t>>* host) {
  std::vector<int64_t> need(layout_.cp_size(), 0);
  for (Rank owner : owners) ++need[owner];
  host->assign(layout_.cp_size(), {});
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    if (need[r] == 0) continue;  // Zero-owned rank: nothing to reserve.
    absl::StatusOr<std::vector<int64_t>> pages = host_[r]->Reserve(need[r]);
    if (!pages.ok()) {
      FreeHostLocked(*host);
      host->clear();
      return pages.status();
    }
    (*host)[r] = *std::move(pages);
  }
  return absl::OkStatus();
}

void HiCacheEngine::FreeHostLocked(
    const std::vector<std::vector<int64_t>>& host) {
  for (size_t r = 0; r < host.size(); ++r) {
    if (host[r].empty()) continue;
    absl::Status freed = host_[r]->Free(host[r]);
    if (!freed.ok()) spdlog::error("host free on rank {}: {}", r, freed);
  }
}

TransferTask HiCacheEngine::MakeTask(const Op& op, uint32_t step) const {
  TransferTask task;
  task.op_id = op.id;
  task.direction = op.kind == Op::Kind::kBackup
                       ? TransferDirection::kDeviceToHost
                       : TransferDirection::kHostToDevice;
  task.step = step;
  // Only the served ranks copy: their index in task.ranks by rank.
  const std::vector<Rank>& served = layout_.served_ranks();
  std::vector<int> slot(layout_.cp_size(), -1);
  task.ranks.resize(served.size());
  for (size_t i = 0; i < served.size(); ++i) {
    task.ranks[i].rank = served[i];
    slot[served[i]] = static_cast<int>(i);
  }
  std::vector<size_t> next(layout_.cp_size(), 0);
  for (size_t i = 0; i < op.pages.size(); ++i) {
    const Rank lane = op.owners[i];
    const int64_t host_page = op.host[lane][next[lane]++];
    if (slot[lane] < 0) continue;  // Another daemon's rank.
    RankCopy& copy = task.ranks[slot[lane]];
    copy.device_pages.push_back(layout_.PhysicalPageOf(op.pages[i]));
    copy.host_pages.push_back(host_page);
  }
  return task;
}

int64_t HiCacheEngine::AcksPerStep() const {
  return static_cast<int64_t>(layout_.served_ranks().size());
}

absl::Status HiCacheEngine::SubmitStepLocked(Op& op, uint32_t step,
                                             absl::Span<const RankFence> fences,
                                             int64_t only_rank) {
  TransferTask task = MakeTask(op, step);
  // Ranks some worker already stored for this step are not copied again.
  const std::vector<bool>* done =
      op.rank_submitted.empty() ? nullptr : &op.rank_submitted[step];
  std::vector<RankCopy> kept;
  for (RankCopy& copy : task.ranks) {
    const bool wanted = only_rank >= 0
                            ? copy.rank == static_cast<Rank>(only_rank)
                            : done == nullptr || !(*done)[copy.rank];
    if (wanted) kept.push_back(std::move(copy));
  }
  task.ranks = std::move(kept);
  for (const RankFence& fence : fences) {
    for (RankCopy& copy : task.ranks) {
      if (copy.rank == fence.rank) copy.wait_fence = fence.fence;
    }
  }
  const int64_t acks = static_cast<int64_t>(task.ranks.size());
  if (acks == 0) return absl::OkStatus();
  if (options_.observer != nullptr) {
    op.step_submit_ns.resize(geometry_.NumSteps(), 0);
    op.step_submit_ns[step] = NowNs();
  }
  op.outstanding += acks;
  outstanding_steps_ += acks;
  absl::Status submitted = transfer_->Submit(std::move(task));
  if (!submitted.ok()) {
    op.outstanding -= acks;
    outstanding_steps_ -= acks;
  }
  return submitted;
}

absl::StatusOr<std::vector<uint64_t>> HiCacheEngine::PrepareBackups(
    absl::Span<const BackupSpec> specs, uint64_t holder) {
  MutexLock lock(&mu_);
  const int64_t page = layout_.page_size();
  // Validate everything first: nothing happens for a bad batch.
  std::vector<int64_t> need(layout_.cp_size(), 0);
  absl::flat_hash_set<LogicalPage> seen;
  for (size_t s = 0; s < specs.size(); ++s) {
    const BackupSpec& spec = specs[s];
    const int64_t max_len = DevicePageCapacity() * page;
    if (spec.logical_len <= 0 || spec.logical_len > max_len ||
        static_cast<int64_t>(spec.pages.size()) !=
            (spec.logical_len + page - 1) / page) {
      return absl::InvalidArgumentError(absl::StrCat(
          "specs[", s, "]: ", spec.pages.size(), " pages cannot hold ",
          spec.logical_len, " tokens at page size ", page));
    }
    for (LogicalPage p : spec.pages) {
      if (!ledger_.IsHeldBy(p, PageHolder::Request(holder))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "specs[", s, "]: page ", p, " is not held by this session"));
      }
      if (!seen.insert(p).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "specs[", s, "]: page ", p,
            " appears twice in this prepare; page ids must be distinct"));
      }
      ++need[layout_.LaneOf(p)];
    }
  }
  // Batch admission: one host eviction step for the whole forward; for the
  // holder's namespace, which may lose its own copies below its guarantee.
  const std::optional<std::string> ns(HolderNamespaceLocked(holder));
  EvictHostLocked(need, {.requester = ns});
  std::vector<uint64_t> ids;
  for (const BackupSpec& spec : specs) {
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kBackup;
    op->state = InitialOpState(OpKind::kBackup);
    op->pages = spec.pages;
    op->owners = layout_.OwnersOf(spec.pages);
    op->logical_len = spec.logical_len;
    if (BackupBlockedByLanesLocked(op->pages)) {  // engine_lanes.cc
      ids.push_back(0);
      continue;
    }
    if (ns.has_value()) {
      // The namespace's host limit. Backups prepared and not yet attached
      // are not in the tree's tally: a limit can be passed by one forward's
      // backups, and the namespace's next backup evicts back under it.
      std::vector<int64_t> per_rank(layout_.cp_size(), 0);
      for (Rank owner : op->owners) ++per_rank[owner];
      if (!FitHostQuotaLocked(*ns, per_rank).ok()) {
        ++stats_.backups_skipped_quota;
        ids.push_back(0);
        continue;
      }
    }
    if (!ReserveHostLocked(op->owners, &op->host).ok()) {
      ++stats_.backups_skipped_no_host;
      spdlog::warn(
          "backup of {} tokens skipped: host pool full after "
          "eviction; {}",
          spec.logical_len, host_[0]->AccountingString());
      ids.push_back(0);
      continue;
    }
    op->id = next_op_++;
    op->submitted.assign(geometry_.NumSteps(), false);
    AcquirePagesLocked(op->pages);
    ++stats_.backups_started;
    ids.push_back(op->id);
    ops_[op->id] = std::move(op);
  }
  return ids;
}

absl::Status HiCacheEngine::AttachBackup(uint64_t id, NodeId node) {
  std::vector<OpEvent> events;
  absl::Status status;
  {
    MutexLock lock(&mu_);
    auto it = ops_.find(id);
    if (it == ops_.end() || it->second->kind != Op::Kind::kBackup) {
      return absl::NotFoundError(absl::StrCat("no backup with op id ", id));
    }
    Op& op = *it->second;
    if (absl::StatusOr<OpState> next =
            NextOpState(op.kind, op.state, OpTrigger::kAttach);
        !next.ok()) {
      if (absl::IsAborted(next.status())) {
        return absl::AbortedError(absl::StrCat(
            "backup ", id, " failed (a copy did not complete); roll it back"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("backup ", id, " is already attached or rolled back"));
    }
    absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
    if (!info.ok()) return info.status();
    if (info->device_pages != op.pages || info->len != op.logical_len) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node, " does not hold exactly the pages of backup ", id,
          " (", info->len, " tokens vs ", op.logical_len,
          "); roll the backup back"));
    }
    absl::StatusOr<CpHostMeta> meta =
        CpHostMeta::Create(op.logical_len, layout_.page_size(),
                           layout_.cp_size(), op.owners, op.host);
    if (!meta.ok()) return meta.status();
    status = tree_->BeginBackup(node, *std::move(meta));
    if (!status.ok()) return status;
    op.node = node;
    AdvanceOpLocked(op, OpTrigger::kAttach);
    // A ready ack was held for this moment.
    if (op.acked == AcksPerStep() * geometry_.NumSteps()) {
      CommitLocked(op, &events);
    }
    event_queue_.insert(event_queue_.end(), events.begin(), events.end());
  }
  DispatchPending();
  return status;
}

void HiCacheEngine::CommitLocked(Op& op, std::vector<OpEvent>* events) {
  if (absl::Status s = tree_->CommitBackup(op.node); !s.ok()) {
    spdlog::error("commit of backup {} on node {} failed: {}", op.id, op.node,
                  s);
    // Never report a commit that did not happen: end it as a failure.
    AdvanceOpLocked(op, OpTrigger::kCommitFailed);
    ++stats_.backups_failed;
    FinishOpLocked(op.id, events);
    return;
  }
  AdvanceOpLocked(op, OpTrigger::kCommit);
  ++stats_.backups_committed;
  if (storage_ != nullptr) StoreHostCopyLocked(op.node);
  if (op.write_back) ++stats_.write_back_backups;
  events->push_back(OpEvent::Committed(op.id, op.node));
  FinishOpLocked(op.id, events);
}

absl::StatusOr<bool> HiCacheEngine::BackupAwaitsClient(uint64_t id) const {
  MutexLock lock(&mu_);
  auto it = ops_.find(id);
  if (it == ops_.end() || it->second->kind != Op::Kind::kBackup) {
    return absl::NotFoundError(absl::StrCat("no backup with op id ", id));
  }
  const Op& op = *it->second;
  if (op.state == OpState::kPrepared) return true;
  if (op.state != OpState::kAttached) return false;
  for (bool submitted : op.submitted) {
    if (!submitted) return true;
  }
  return false;
}

absl::Status HiCacheEngine::RollbackBackup(uint64_t id) {
  std::vector<OpEvent> events;
  {
    MutexLock lock(&mu_);
    auto it = ops_.find(id);
    if (it == ops_.end() || it->second->kind != Op::Kind::kBackup) {
      return absl::NotFoundError(absl::StrCat("no backup with op id ", id));
    }
    Op& op = *it->second;
    if (OpGivenUp(op.state)) {
      if (OpFailed(op.state)) {  // The client is done with a failed backup.
        AdvanceOpLocked(op, OpTrigger::kRollback);
        EraseSettledFailedBackupLocked(id);
      }
      return absl::OkStatus();
    }
    if (op.state == OpState::kAttached) {
      // The reservation is freed from the op's own record below.
      (void)tree_->AbortBackup(op.node);
    }
    AdvanceOpLocked(op, OpTrigger::kRollback);
    ++stats_.backups_rolled_back;
    events.push_back(OpEvent::RolledBack(id));
    if (op.outstanding == 0) FinishOpLocked(id, &events);
    event_queue_.insert(event_queue_.end(), events.begin(), events.end());
  }
  DispatchPending();
  return absl::OkStatus();
}

bool HiCacheEngine::AdvanceOpLocked(Op& op, OpTrigger trigger) {
  absl::StatusOr<OpState> next = NextOpState(op.kind, op.state, trigger);
  if (!next.ok()) {
    spdlog::error("op {}: {}", op.id, next.status());
#ifndef NDEBUG
    HICACHE_CHECK(false, "an op moved by a trigger its state refuses");
#endif
    return false;
  }
  const bool changed = *next != op.state;
  op.state = *next;
  return changed;
}

// Ends an op whose copies are all complete: frees what it no longer needs.
void HiCacheEngine::FinishOpLocked(uint64_t id,
                                   std::vector<OpEvent>* events) {
  auto it = ops_.find(id);
  Op& op = *it->second;
  if (op.kind == Op::Kind::kBackup) {
    if (op.state != OpState::kCommitted) {
      FreeHostLocked(op.host);  // Rolled back: orphan reservation.
    }
    ReleasePagesLocked(op.pages);
    if (OpFailed(op.state)) {
      FinishFailedBackupLocked(op, events);
      return;
    }
    ops_.erase(it);
    return;
  }
  // Load.
  if (op.state == OpState::kLoadFailing) {
    FinishFailedLoadLocked(op, events);
    return;
  }
  ReleasePagesLocked(op.pages);
  if (op.state == OpState::kLoadAbandoned) {
    // Rolled back before its copies finished: the pages were never attached.
    ledger_.Remove(op.pages);
    FreeDeviceLocked(op.pages);
    for (const auto& [node, count] : op.chain) {
      (void)tree_->ReleaseHostRef(node);
    }
    if (op.locked_parent != kNoNode) (void)tree_->Unlock(op.locked_parent);
    events->push_back(OpEvent::LoadDone(id, false));
    ops_.erase(it);
  }
}

void HiCacheEngine::OnStepDone(StepDone done) {
  const uint64_t id = done.op_id;
  const Rank rank = done.rank;
  const uint32_t step = done.step;
  const absl::Status& status = done.status;
  const uint64_t bytes = done.bytes;
  std::vector<OpEvent> events;
  std::optional<LayerCopyEvent> observed;
  {
    MutexLock lock(&mu_);
    ops_cv_.SignalAll();  // Writers waiting for staged write-backs recheck.
    if (--outstanding_steps_ == 0) idle_cv_.SignalAll();
    auto it = ops_.find(id);
    if (it == ops_.end()) return;
    Op& op = *it->second;
    --op.outstanding;
    ++op.acked;
    ++stats_.steps_completed;
    stats_.step_latency_ns_total += NowNs() - op.submit_ns;
    if (options_.observer != nullptr) {
      ++observer_calls_;
      const int64_t now = NowNs();
      const int64_t submitted =
          step < op.step_submit_ns.size() && op.step_submit_ns[step] != 0
              ? op.step_submit_ns[step]
              : op.submit_ns;
      observed = LayerCopyEvent{
          .kind = op.kind == Op::Kind::kBackup ? LayerCopyEvent::Kind::kBackup
                                               : LayerCopyEvent::Kind::kLoad,
          .write_back = op.write_back,
          .rank = rank,
          .step = step,
          .num_steps = geometry_.NumSteps(),
          .ok = status.ok(),
          .bytes = bytes,
          .since_start = absl::Nanoseconds(now - op.start_ns),
          .since_submit = absl::Nanoseconds(now - submitted),
      };
    }
    if (done.direction == TransferDirection::kDeviceToHost) {
      stats_.bytes_to_host += bytes;
    } else {
      stats_.bytes_to_device += bytes;
    }
    // Never commit or attach bytes that did not arrive (engine_failures.cc).
    if (!status.ok()) FailOpLocked(op, rank, step, status);
    const bool backup = op.kind == Op::Kind::kBackup;
    // A failed op announces no step, only its end.
    if (!OpFailed(op.state)) {
      events.push_back(backup ? OpEvent::BackupStep(id, rank, step)
                              : OpEvent::LoadStep(id, rank, step,
                                                  std::move(done.fence)));
    }
    const bool all_acked = op.acked == AcksPerStep() * geometry_.NumSteps();
    if (OpEnding(op.state)) {
      if (op.outstanding == 0) FinishOpLocked(id, &events);
    } else if (all_acked) {
      if (backup) {
        // Visible only now: every rank's final ack, target and draft steps.
        if (op.state == OpState::kAttached) CommitLocked(op, &events);
        // Otherwise the ready ack waits for AttachBackup or RollbackBackup.
      } else {
        CompleteLoadLocked(op, &events);
      }
    }
    ReapDroppedLocked();  // A failed load may release dropped nodes.
    event_queue_.insert(event_queue_.end(), events.begin(), events.end());
  }
  if (observed.has_value()) {
    options_.observer->OnLayerCopy(*observed);
    MutexLock lock(&mu_);
    if (--observer_calls_ == 0) idle_cv_.SignalAll();
  }
  DispatchPending();
}

void HiCacheEngine::DispatchPending() {
  // One dispatcher at a time, in the order the events were queued under mu_:
  // a node's commit never overtakes its steps' events.
  MutexLock dispatch(&dispatch_mu_);
  while (true) {
    std::vector<OpEvent> events;
    EngineListener* listener;
    {
      MutexLock lock(&mu_);
      events.swap(event_queue_);
      listener = listener_;
    }
    if (events.empty()) return;
    if (listener == nullptr) continue;
    for (const OpEvent& e : events) listener->OnOpEvent(e);

  }
}

absl::Status HiCacheEngine::CheckInvariants() const {
  MutexLock lock(&mu_);
  if (absl::Status s = tree_->CheckInvariants(); !s.ok()) return s;
  if (absl::Status s = device_->CheckInvariants(); !s.ok()) return s;
  // Host pages: committed copies + pending reservations + op reservations
  // must be exactly the reserved pages of every rank.
  std::vector<absl::flat_hash_set<int64_t>> held(layout_.cp_size());
  auto hold = [&](Rank r, int64_t page) -> absl::Status {
    if (!held[r].insert(page).second) {
      return absl::InternalError(
          absl::StrCat("host page ", page, " of rank ", r, " held twice"));
    }
    return absl::OkStatus();
  };
  for (const NodeInfo& n : tree_->Dump({})) {
    const NodeInfo detail = *tree_->Inspect(n.id);
    for (Rank r = 0; r < detail.host_pages.size(); ++r) {
      for (int64_t p : detail.host_pages[r]) {
        if (absl::Status s = hold(r, p); !s.ok()) return s;
      }
    }
    for (LogicalPage p : detail.device_pages) {
      if (!ledger_.IsHeldBy(p, PageHolder::Tree())) {
        return absl::InternalError(
            absl::StrCat("tree page ", p, " is not in the tree page set"));
      }
    }
  }
  // Host references a write-back holds: their nodes are still there.
  for (const auto& [node, count] : write_back_host_refs_) {
    absl::StatusOr<NodeInfo> info = tree_->Inspect(node);
    if (!info.ok() || info->host_ref < count) {
      return absl::InternalError(absl::StrCat(
          "write-back holds ", count, " host reference(s) on node ", node,
          info.ok() ? absl::StrCat(", which has ", info->host_ref)
                    : ", which is gone"));
    }
  }
  // Nodes dropped with their lanes but still held, tainted request pages.
  if (absl::Status s = CheckDroppedLocked(hold); !s.ok()) return s;
  for (const auto& [id, op] : ops_) {
    if (op->kind != Op::Kind::kBackup || op->state == OpState::kCommitted) {
      continue;
    }
    // An attached backup's reservation is the node's pending metadata, not
    // reported by Inspect: count it from the op.
    for (Rank r = 0; r < op->host.size(); ++r) {
      for (int64_t p : op->host[r]) {
        if (absl::Status s = hold(r, p); !s.ok()) return s;
      }
    }
  }
  for (Rank r = 0; r < layout_.cp_size(); ++r) {
    if (static_cast<int64_t>(held[r].size()) != host_[r]->used_pages()) {
      return absl::InternalError(absl::StrCat(
          "rank ", r, ": ", host_[r]->used_pages(), " host pages reserved but ",
          held[r].size(), " accounted for (leak)"));
    }
    if (absl::Status s = host_[r]->CheckInvariants(); !s.ok()) return s;
  }
  // Device pages: every allocated page has exactly one holder in the ledger,
  // or waits, freed, for the copies that still touch it.
  if (absl::Status s = ledger_.CheckInvariants(); !s.ok()) return s;
  int64_t allocated = 0;
  for (Rank l = 0; l < layout_.cp_size(); ++l) {
    allocated += device_->Counts(l).allocated;
  }
  for (LogicalPage p : free_when_idle_) {
    if (ledger_.HolderOf(p).has_value()) {
      return absl::InternalError(
          absl::StrCat("page ", p, " is freed-when-idle but still held"));
    }
  }
  if (allocated != ledger_.size() + static_cast<int64_t>(free_when_idle_.size())) {
    return absl::InternalError(absl::StrCat(
        allocated, " device pages allocated but the ledger holds ",
        ledger_.size(), " and ", free_when_idle_.size(),
        " wait for copies (leak or double holder)"));
  }
  return absl::OkStatus();
}

}  // namespace hicache
