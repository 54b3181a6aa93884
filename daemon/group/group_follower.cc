#include "daemon/group/group_follower.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/group/step_completer.h"
#include "spdlog/spdlog.h"

namespace hicache::group {

GroupFollower::GroupFollower(GroupFollowerOptions options,
                             TransferEngineFactory make_local, FatalFn on_fatal)
    : options_(std::move(options)),
      make_local_(std::move(make_local)),
      on_fatal_(std::move(on_fatal)) {}

GroupFollower::~GroupFollower() { Stop(); }

absl::Status GroupFollower::Run(std::unique_ptr<comm::Communicator> leader_link,
                                uint64_t epoch, uint32_t member_index) {
  MutexLock run(&run_mu_);
  {
    MutexLock lock(&mu_);
    if (ran_ || stopping_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CP group ", options_.group_name,
          " follower: ", stopping_ ? "stopped" : "already running"));
    }
  }
  if (leader_link == nullptr) {
    return absl::InvalidArgumentError("CP group follower: no link");
  }
  FollowerScope scope = options_.scope;
  scope.leader = options_.leader;
  auto executor = std::make_unique<FollowerExecutor>(
      std::move(scope), std::move(leader_link), epoch, make_local_,
      [this](const Frame& frame) { return OnControl(frame); },
      [this](const absl::Status& cause) {
        // The link failed (or the accounting diverged: the leader is lost
        // either way). Lost first, so that it is what reports it: the
        // health's own death, on its thread, then finds lost_ set.
        Lost(absl::StrCat("the link failed: ", cause.ToString()));
        // The health ends at once too, sending no heartbeat into a dead
        // link. Under mu_, like Heard: LinkFailed only takes the health's
        // leaf lock and wakes its thread.
        MutexLock lock(&mu_);
        if (health_ != nullptr) health_->LinkFailed(cause);
      });
  FollowerExecutor* const raw = executor.get();
  absl::StatusOr<std::unique_ptr<MemberHealth>> health = MemberHealth::Create(
      MemberHealthOptions{.peer = options_.leader,
                          .member_index = member_index,
                          .interval = options_.heartbeat_interval,
                          .timeout = options_.heartbeat_timeout},
      [raw](const FrameBody& body) { return raw->SendControl(body); },
      [this](const absl::Status& reason) { Lost(reason.message()); });
  if (!health.ok()) return health.status();
  MemberHealth* const watch = health->get();
  executor_ = std::move(executor);
  {
    MutexLock lock(&mu_);
    ran_ = true;
    epoch_ = epoch;
    health_ = *std::move(health);
    executor_view_ = raw;
  }
  if (absl::Status s = raw->Start(); !s.ok()) {
    // Nothing was heard or lost yet: undo quietly, the caller gets it.
    std::unique_ptr<MemberHealth> h;
    {
      MutexLock lock(&mu_);
      lost_ = true;
      reason_ = s.ToString();
      h = std::move(health_);
      ack_cv_.SignalAll();
      AwaitSendersLocked();
      executor_view_ = nullptr;
    }
    h.reset();
    executor_.reset();
    return s;
  }
  if (absl::Status s = watch->Start(); !s.ok()) {
    Lost(absl::StrCat("its health could not start: ", s.ToString()));
  }
  spdlog::info("CP group {}: following {} (epoch {}, member {})",
               options_.group_name, options_.leader, epoch, member_index);
  return absl::OkStatus();
}

absl::Status GroupFollower::OnControl(const Frame& frame) {
  if (frame.header.kind == FrameKind::kBye) {
    Lost(absl::StrCat("it said bye: ", std::get<Bye>(frame.body).reason));
    return absl::OkStatus();
  }
  if (frame.header.kind == FrameKind::kLayerStored) {
    return absl::InvalidArgumentError("the leader sent a layer_stored frame");
  }
  {
    MutexLock lock(&mu_);
    if (health_ != nullptr) health_->Heard(frame.header.kind);
    if (frame.header.kind == FrameKind::kLayerStoredAck) {
      const auto& ack = std::get<LayerStoredAck>(frame.body);
      auto it = acks_.find(ack.request_id);
      // An unknown id is an answer that came after its caller gave up.
      if (it != acks_.end() && !it->second.has_value()) {
        it->second = CopyStatus(ack.status);
        ack_cv_.SignalAll();
      }
      return absl::OkStatus();
    }
  }
  if (frame.header.kind == FrameKind::kWorkerEvents) {
    return ApplyWorkerEvents(std::get<WorkerEventBatch>(frame.body));
  }
  return absl::OkStatus();
}

absl::Status GroupFollower::ApplyWorkerEvents(const WorkerEventBatch& batch) {
  const std::vector<Rank>& ranks = options_.scope.ranks;
  for (size_t i = 0; i < batch.events.size(); ++i) {
    const WorkerEventRecord& e = batch.events[i];
    const bool per_rank = e.kind == WorkerEventKind::kBackupStep ||
                          e.kind == WorkerEventKind::kLoadStep;
    if (per_rank && std::find(ranks.begin(), ranks.end(), e.rank) ==
                        ranks.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker event ", i, " (op ", e.op, ") is for rank ", e.rank,
          ", which this follower does not hold"));
    }
  }
  EventHub* const hub = options_.events;
  if (hub == nullptr) return absl::OkStatus();
  MutexLock lock(&events_mu_);
  for (const WorkerEventRecord& e : batch.events) {
    if (!tagged_.contains(e.op)) {
      tagged_.insert(e.op);
      tag_order_.push_back(e.op);
      // Ops whose outcome never came (the leader forgot them) must not grow
      // it: past the bound the oldest go (an op that is somehow still
      // running would be tagged again, replaying its queued events).
      while (tagged_.size() > kMaxTaggedOps) {
        tagged_.erase(tag_order_.front());
        tag_order_.pop_front();
      }
      if (tag_order_.size() > 2 * kMaxTaggedOps) {  // Ended ops' entries.
        std::deque<uint64_t> live;
        for (uint64_t op : tag_order_) {
          if (tagged_.contains(op)) live.push_back(op);
        }
        tag_order_.swap(live);
      }
      hub->Tag(e.op, e.ns);
    }
    switch (e.kind) {
      case WorkerEventKind::kBackupStep:
        hub->OnOpEvent(OpEvent::BackupStep(e.op, e.rank, e.step));
        break;
      case WorkerEventKind::kCommitted:
        // The tree is the leader's: no node.
        hub->OnOpEvent(OpEvent::Committed(e.op, kNoNode));
        tagged_.erase(e.op);
        break;
      case WorkerEventKind::kRolledBack:
        hub->OnOpEvent(OpEvent::RolledBack(e.op));
        tagged_.erase(e.op);
        break;
      case WorkerEventKind::kLoadStep:
        hub->OnOpEvent(OpEvent::LoadStep(e.op, e.rank, e.step, e.fence));
        break;
      case WorkerEventKind::kLoadDone:
        hub->OnOpEvent(OpEvent::LoadDone(e.op, e.ok));
        tagged_.erase(e.op);
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status GroupFollower::ForwardLayerStored(const std::string& ns,
                                               Rank rank, uint32_t step,
                                               absl::Span<const uint64_t> ops) {
  const std::vector<Rank>& ranks = options_.scope.ranks;
  if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CP group ", options_.group_name, ": this follower does not hold rank ",
        rank));
  }
  if (ops.size() > kMaxLayerStoredOps) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_stored names ", ops.size(), " ops; the limit is ",
                     kMaxLayerStoredOps));
  }
  if (ns.size() > kMaxLayerStoredNamespaceBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace of ", ns.size(), " bytes; the limit is ",
                     kMaxLayerStoredNamespaceBytes));
  }
  uint64_t id = 0;
  FollowerExecutor* executor = nullptr;
  {
    MutexLock lock(&mu_);
    if (stopping_ || lost_ || !ran_ || executor_view_ == nullptr) {
      ++acks_failed_;
      return UnavailableLocked();
    }
    id = ++next_request_;
    acks_[id] = std::nullopt;
    ++senders_;
    executor = executor_view_;
  }
  // Not under mu_ (the link's locks are not below it); Stop waits for it.
  const absl::Status sent = executor->SendControl(LayerStoredRequest{
      .request_id = id,
      .ns = ns,
      .rank = rank,
      .step = step,
      .ops = std::vector<uint64_t>(ops.begin(), ops.end())});
  MutexLock lock(&mu_);
  if (--senders_ == 0) ack_cv_.SignalAll();
  if (!sent.ok()) {
    acks_.erase(id);
    ++acks_failed_;
    return absl::UnavailableError(absl::StrCat(
        "CP group ", options_.group_name, ": layer_stored not sent to ",
        options_.leader, ": ", sent.message()));
  }
  ++acks_relayed_;
  const absl::Time deadline = absl::Now() + options_.heartbeat_timeout;
  while (true) {
    auto it = acks_.find(id);
    if (it->second.has_value()) {
      absl::Status answer = CopyStatus(*it->second);
      acks_.erase(it);
      if (!answer.ok()) ++acks_failed_;
      return answer;
    }
    if (stopping_ || lost_) {
      acks_.erase(it);
      ++acks_failed_;
      return UnavailableLocked();
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      acks_.erase(it);
      ++acks_failed_;
      return absl::UnavailableError(absl::StrCat(
          "CP group ", options_.group_name, ": leader ", options_.leader,
          " did not answer a layer_stored within ",
          absl::FormatDuration(options_.heartbeat_timeout)));
    }
    ack_cv_.WaitWithTimeout(&mu_, left);
  }
}

absl::Status GroupFollower::UnavailableLocked() const {
  return absl::UnavailableError(
      stopping_ ? absl::StrCat("CP group ", options_.group_name,
                               " follower stopped")
      : lost_   ? reason_
                : absl::StrCat("CP group ", options_.group_name,
                               " follower has not joined its leader yet"));
}

void GroupFollower::AwaitSendersLocked() {
  while (senders_ > 0) ack_cv_.Wait(&mu_);
}

void GroupFollower::Lost(absl::string_view cause) {
  absl::Status fatal;
  {
    MutexLock lock(&mu_);
    if (lost_ || stopping_) return;
    lost_ = true;
    fatal = absl::UnavailableError(
        absl::StrCat("CP group ", options_.group_name, " leader ",
                     options_.leader, " lost: ", cause));
    reason_ = std::string(fatal.message());
    ack_cv_.SignalAll();  // ForwardLayerStored's waiters.
  }
  spdlog::error("{}", fatal.message());
  if (on_fatal_) on_fatal_(fatal);
}

FollowerExecutor::Stats GroupFollower::ReadExecutorStats() const {
  FollowerExecutor* executor = nullptr;
  {
    MutexLock lock(&mu_);
    if (executor_view_ == nullptr) return last_executor_;
    executor = executor_view_;
    ++senders_;  // Stop waits for it before destroying the executor.
  }
  // Not under mu_: stats() takes the link's locks, which are not below it.
  FollowerExecutor::Stats stats = executor->stats();
  MutexLock lock(&mu_);
  if (--senders_ == 0) ack_cv_.SignalAll();
  return stats;
}

FollowerExecutor::Stats GroupFollower::executor_stats() const {
  return ReadExecutorStats();
}

GroupStatus GroupFollower::Status() const {
  GroupStatus status{.name = options_.group_name,
                     .role = GroupRole::kFollower,
                     .cp_size = options_.cp_size};
  const FollowerExecutor::Stats e = ReadExecutorStats();
  MutexLock lock(&mu_);
  status.epoch = epoch_;
  status.reason = reason_;
  if (stopping_) {
    status.state = GroupState::kStopped;
  } else if (lost_) {
    status.state = GroupState::kDegraded;
  } else {
    status.state = ran_ ? GroupState::kFormed : GroupState::kForming;
  }
  const MemberHealthSnapshot h =
      health_ != nullptr ? health_->snapshot() : last_health_;
  status.members.push_back(
      GroupMemberStatus{.index = 0,
                        .name = options_.leader,
                        .epoch = epoch_,
                        .live = ran_ && !lost_,
                        .last_heard_age = h.last_heard_age,
                        .reason = reason_,
                        .heartbeats_sent = h.heartbeats_sent,
                        .heartbeats_received = h.heartbeats_received});
  GroupFollowerCounters& c = status.follower;
  c.tasks_received = e.tasks_received;
  c.steps_executed = e.steps_executed;
  c.steps_refused = e.steps_refused;
  c.steps_rejected = e.steps_rejected;
  c.pending = e.pending;
  c.digests_checked = e.digests_checked;
  c.digests_matched = e.digests_matched;
  c.diverged = e.diverged;
  if (e.last_digest_match != absl::InfinitePast()) {
    c.last_digest_match_age =
        std::max(absl::ZeroDuration(), absl::Now() - e.last_digest_match);
  }
  c.acks_relayed = acks_relayed_;
  c.acks_failed = acks_failed_;
  return status;
}

void GroupFollower::Stop() {
  MutexLock run(&run_mu_);
  std::unique_ptr<MemberHealth> health;
  {
    MutexLock lock(&mu_);
    if (stopping_ && executor_ == nullptr) return;
    stopping_ = true;
    ack_cv_.SignalAll();  // ForwardLayerStored's waiters.
    health = std::move(health_);
  }
  if (health != nullptr) {
    health->Stop();  // Waits for a running on_dead (it takes mu_ only).
    const MemberHealthSnapshot last = health->snapshot();
    MutexLock lock(&mu_);
    last_health_ = last;
  }
  health.reset();
  if (executor_ != nullptr) {
    absl::Status bye = executor_->SendControl(
        Bye{.reason = absl::StrCat("CP group ", options_.group_name,
                                   " follower stopping")});
    if (!bye.ok()) {
      spdlog::debug("CP group {}: no bye to {}: {}", options_.group_name,
                    options_.leader, bye);
    }
    // Its counters for Status once it is gone (read without mu_).
    const FollowerExecutor::Stats last = executor_->stats();
    {
      MutexLock lock(&mu_);
      // No new sender (stopping_ is set); a stats reader leaves promptly.
      AwaitSendersLocked();
      last_executor_ = last;
      executor_view_ = nullptr;
    }
    executor_.reset();  // Closes the link, joins its threads.
  }
}

}  // namespace hicache::group
