#include "daemon/group/remote_transfer_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache::group {
namespace {

const char* DirName(TransferDirection d) {
  return d == TransferDirection::kDeviceToHost ? "d2h" : "h2d";
}

// The most a Tasks frame's body may take besides the header and the count.
constexpr size_t kTasksBudget = comm::kMaxFrameBytes - kFrameHeaderBytes - 4;

bool Enabled(absl::Duration d) {
  return d > absl::ZeroDuration() && d != absl::InfiniteDuration();
}

// Saturating: a huge duration is "never".
std::chrono::steady_clock::duration ToClock(absl::Duration d) {
  if (d >= absl::Hours(24 * 365)) return std::chrono::hours(24 * 365);
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      absl::ToChronoNanoseconds(d));
}

// What the leader checks of a task before it ships it: what the follower's
// FollowerExecutor would refuse, as far as the leader knows its bounds (a
// bound of 0 is unknown).
TransferTaskBounds BoundsOf(const RemoteMember& member) {
  TransferTaskBounds bounds{
      .context = absl::StrCat(member.name, ": "),
      .serves =
          [ranks = member.ranks](Rank rank) {
            return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
          },
      // Its workers' fences are the follower's, waited on there.
      .refuse_fences = true,
      .refuse_repeated_ranks = true};
  if (member.num_steps != 0) bounds.num_steps = member.num_steps;
  if (member.device_pages_per_rank != 0) {
    bounds.device_pages_per_rank = member.device_pages_per_rank;
  }
  if (member.host_pages_per_rank != 0) {
    bounds.host_pages_per_rank = member.host_pages_per_rank;
  }
  return bounds;
}

}  // namespace

RemoteTransferEngine::RemoteTransferEngine(
    RemoteMember member, std::unique_ptr<comm::Communicator> link,
    uint64_t epoch, TransferListener* listener, ControlHandler on_control,
    RemoteTransferOptions options, FailureHandler on_failure)
    : member_(std::move(member)),
      bounds_(BoundsOf(member_)),
      listener_(listener),
      on_control_(std::move(on_control)),
      options_(options),
      on_failure_(std::move(on_failure)),
      tally_(member_.ranks, member_.device_pages_per_rank,
             member_.host_pages_per_rank),
      last_digest_at_(Clock::now()),
      completer_([this](StepDone done) {
        listener_->OnStepDone(std::move(done));
        Delivered(1);
      }),
      link_(std::make_unique<WireLink>(std::move(link), epoch)),
      sender_([this] { SenderLoop(); }) {}

RemoteTransferEngine::~RemoteTransferEngine() {
  Fail(absl::CancelledError("remote transfer engine destroyed"));
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    send_cv_.SignalAll();
  }
  sender_.join();
  // Then link_ is destroyed (joining its threads: no handler runs after
  // that), then the completer (delivering what Fail queued).
}

absl::Status RemoteTransferEngine::Start() {
  absl::Status started =
      link_->Start([this](Frame frame) { return OnFrame(std::move(frame)); },
                   [this](const absl::Status& cause) { Fail(cause); });
  if (!started.ok()) Fail(started);
  return started;
}

bool RemoteTransferEngine::Serves(Rank rank) const {
  return bounds_.serves(rank);
}

absl::Status RemoteTransferEngine::Validate(const TransferTask& task) const {
  if (absl::Status valid = CheckTransferTask(bounds_, task); !valid.ok()) {
    return valid;
  }
  // The wire's own bound: SenderLoop splits a task by rank, no further.
  for (const RankCopy& copy : task.ranks) {
    if (kTaskFixedBytes + EncodedRankCopyBytes(copy) > kTasksBudget) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", copy.rank, ": ", copy.device_pages.size(),
                       " pages do not fit in one frame to ", member_.name));
    }
  }
  return absl::OkStatus();
}

StepDone RemoteTransferEngine::Unavailable(const Site& site,
                                           const absl::Status& cause) const {
  return StepDone{.op_id = site.op_id,
                  .direction = site.direction,
                  .rank = site.rank,
                  .step = site.step,
                  .status = absl::UnavailableError(absl::StrCat(
                      member_.name,
                      " (ranks served remotely) is gone: ", cause.ToString())),
                  .bytes = 0};
}

absl::Status RemoteTransferEngine::Submit(TransferTask task) {
  if (absl::Status valid = Validate(task); !valid.ok()) return valid;
  if (task.ranks.empty()) return absl::OkStatus();
  MutexLock lock(&mu_);
  const int64_t n = static_cast<int64_t>(task.ranks.size());
  in_flight_ += n;
  ++stats_.tasks_submitted;
  stats_.steps_submitted += n;
  if (!failure_.ok()) {
    std::vector<StepDone> failed;
    for (const RankCopy& copy : task.ranks) {
      failed.push_back(Unavailable(
          Site{task.op_id, task.direction, copy.rank, task.step}, failure_));
    }
    stats_.steps_failed += n;
    completer_.Complete(std::move(failed));  // Never calls back inline.
    return absl::OkStatus();
  }
  const Clock::time_point now = Clock::now();
  for (const RankCopy& copy : task.ranks) {
    const Site site{task.op_id, task.direction, copy.rank, task.step};
    outstanding_[site].push_back(waiting_base_ + waiting_.size());
    waiting_.push_back(Waiting{.site = site, .since = now});
  }
  outbox_.push_back(std::move(task));
  send_cv_.SignalAll();
  return absl::OkStatus();
}

void RemoteTransferEngine::SenderLoop() {
  while (true) {
    std::vector<TransferTask> batch;
    bool digest_due = false;
    absl::Status overdue;
    {
      MutexLock lock(&mu_);
      while (true) {
        const Clock::time_point now = Clock::now();
        Clock::time_point wake = Clock::time_point::max();
        if (failure_.ok()) {
          overdue = OverdueLocked(now, &wake);
          if (!overdue.ok()) break;
        }
        if (!outbox_.empty()) {
          batch.swap(outbox_);
          break;
        }
        if (stopping_) return;
        if (failure_.ok() && DigestDueLocked(now, &wake)) {
          digest_due = true;
          break;
        }
        // Nothing outstanding and no digest due: no timer at all.
        if (wake == Clock::time_point::max()) {
          send_cv_.Wait(&mu_);
        } else {
          send_cv_.WaitWithTimeout(&mu_, absl::FromChrono(wake - now));
        }
      }
      if (!overdue.ok()) ++stats_.step_timeouts;
    }
    if (!overdue.ok()) {
      Fail(overdue);
      continue;
    }
    // Pack into frames under the limit; a task too large for one frame is
    // split by rank (Validate made sure one rank's copy fits).
    std::vector<TaskBatch> frames(1);
    std::vector<size_t> frame_bytes(1, 0);  // Body bytes after the count.
    auto add = [&](TransferTask task, size_t bytes) {
      if (frame_bytes.back() + bytes > kTasksBudget &&
          !frames.back().tasks.empty()) {
        frames.emplace_back();
        frame_bytes.push_back(0);
      }
      frames.back().tasks.push_back(std::move(task));
      frame_bytes.back() += bytes;
    };
    for (TransferTask& task : batch) {
      const size_t bytes = EncodedTaskBytes(task);
      if (bytes <= kTasksBudget) {
        add(std::move(task), bytes);
        continue;
      }
      for (RankCopy& copy : task.ranks) {
        TransferTask part{.op_id = task.op_id,
                          .direction = task.direction,
                          .step = task.step};
        const size_t part_bytes = kTaskFixedBytes + EncodedRankCopyBytes(copy);
        part.ranks.push_back(std::move(copy));
        add(std::move(part), part_bytes);
      }
    }
    bool link_ok = true;
    for (size_t f = 0; f < frames.size() && !batch.empty(); ++f) {
      // What the follower will account for this frame (CopyTally).
      tally_.CountFrame();
      for (const TransferTask& task : frames[f].tasks) tally_.AddTask(task);
      {
        // Counted before the send: the completions may come back first.
        MutexLock lock(&mu_);
        ++stats_.task_frames;
        stats_.task_frame_bytes +=
            static_cast<int64_t>(kFrameHeaderBytes + 4 + frame_bytes[f]);
      }
      absl::Status sent = link_->Send(frames[f]);
      if (!sent.ok()) {
        // The link failed (its on_failure follows; whichever comes first
        // fails the engine): the member is unavailable.
        Fail(absl::UnavailableError(sent.message()));
        link_ok = false;
        break;
      }
    }
    if (!link_ok) continue;
    if (!digest_due && !batch.empty()) {
      // Under steady traffic the outbox is never empty when the loop looks:
      // a digest due is sent between batches.
      MutexLock lock(&mu_);
      Clock::time_point unused = Clock::time_point::max();
      digest_due = failure_.ok() && DigestDueLocked(Clock::now(), &unused);
    }
    if (digest_due) SendDigest();
  }
}

absl::Status RemoteTransferEngine::OverdueLocked(
    Clock::time_point now, Clock::time_point* wake) const {
  if (!Enabled(options_.step_timeout)) return absl::OkStatus();
  const Clock::duration timeout = ToClock(options_.step_timeout);
  if (!waiting_.empty()) {
    const Waiting& oldest = waiting_.front();
    if (now - oldest.since >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          member_.name, " did not answer op ", oldest.site.op_id, " ",
          DirName(oldest.site.direction), " rank ", oldest.site.rank, " step ",
          oldest.site.step, " for ",
          absl::FormatDuration(absl::FromChrono(now - oldest.since)),
          " (step timeout ", absl::FormatDuration(options_.step_timeout), "); ",
          waiting_.size(), " steps outstanding"));
    }
    *wake = std::min(*wake, oldest.since + timeout);
  }
  if (digest_pending_.has_value()) {
    if (now - digest_pending_->sent >= timeout) {
      return absl::DeadlineExceededError(absl::StrCat(
          member_.name, " did not answer the accounting digest of tasks frame ",
          digest_pending_->digest.tasks_frames, " for ",
          absl::FormatDuration(absl::FromChrono(now - digest_pending_->sent)),
          " (step timeout ", absl::FormatDuration(options_.step_timeout), ")"));
    }
    *wake = std::min(*wake, digest_pending_->sent + timeout);
  }
  return absl::OkStatus();
}

bool RemoteTransferEngine::DigestDueLocked(Clock::time_point now,
                                           Clock::time_point* wake) const {
  if (!Enabled(options_.digest_interval)) return false;
  if (digest_pending_.has_value()) return false;  // Its answer wakes us.
  // Nothing shipped since the last one: nothing new to compare.
  if (digest_sent_ && tally_.tasks_frames() == last_digest_frames_) {
    return false;
  }
  const Clock::time_point due =
      last_digest_at_ + ToClock(options_.digest_interval);
  if (now >= due) return true;
  *wake = std::min(*wake, due);
  return false;
}

void RemoteTransferEngine::SendDigest() {
  const Clock::time_point now = Clock::now();
  Digest digest = tally_.Snapshot();
  {
    MutexLock lock(&mu_);
    if (!failure_.ok()) return;
    // Recorded before sending: the answer may come back first.
    digest_pending_ = PendingDigest{.digest = digest, .sent = now};
    ++stats_.digests_sent;
  }
  last_digest_at_ = now;
  last_digest_frames_ = digest.tasks_frames;
  digest_sent_ = true;
  absl::Status sent = link_->Send(std::move(digest));
  if (!sent.ok()) Fail(absl::UnavailableError(sent.message()));
}

absl::Status RemoteTransferEngine::HandleDigestResult(DigestResult result) {
  Digest mine;
  {
    MutexLock lock(&mu_);
    if (!failure_.ok()) return absl::OkStatus();
    if (!digest_pending_.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a digest result for tasks frame ", result.tasks_frames,
                       " with no digest outstanding"));
    }
    mine = std::move(digest_pending_->digest);
    digest_pending_.reset();
  }
  std::string diff = DescribeDivergence(mine.tasks_frames, mine.ranks,
                                        result.tasks_frames, result.ranks);
  if (diff.empty() && result.match) {
    {
      MutexLock lock(&mu_);
      ++stats_.digests_matched;
      stats_.last_digest_match = absl::Now();
      send_cv_.SignalAll();  // The next digest may be due.
    }
    if (options_.on_digest) options_.on_digest(mine.tasks_frames, true);
    return absl::OkStatus();
  }
  if (diff.empty())
    diff = "the follower reports a mismatch the leader does not see";
  spdlog::error(
      "CP group member {} pool accounting diverged at tasks frame {}: {}. "
      "Leader's view: {}. Follower's view: {}",
      member_.name, mine.tasks_frames, diff, DescribeTallies(mine.ranks),
      DescribeTallies(result.ranks));
  {
    MutexLock lock(&mu_);
    ++stats_.digest_divergences;
  }
  Fail(absl::DataLossError(
      absl::StrCat("pool accounting diverged at tasks frame ",
                   mine.tasks_frames, ": ", diff)));
  if (options_.on_digest) options_.on_digest(mine.tasks_frames, false);
  return absl::OkStatus();
}

absl::Status RemoteTransferEngine::OnFrame(Frame frame) {
  switch (frame.header.kind) {
    case FrameKind::kStepDones:
      return HandleStepDones(
          std::move(std::get<StepDoneBatch>(frame.body).dones));
    case FrameKind::kTasks:
      return absl::InvalidArgumentError("a follower sent a tasks frame");
    case FrameKind::kDigestResult:
      return HandleDigestResult(std::move(std::get<DigestResult>(frame.body)));
    case FrameKind::kDigest:
      return absl::InvalidArgumentError("a follower sent a digest frame");
    case FrameKind::kHello:
    case FrameKind::kHeartbeat:
    case FrameKind::kBye:
    // Worker events and acks (kinds 6-8): the control handler's.
    case FrameKind::kWorkerEvents:
    case FrameKind::kLayerStored:
    case FrameKind::kLayerStoredAck:
      if (on_control_) return on_control_(frame);
      if (frame.header.kind == FrameKind::kBye) {
        Fail(absl::UnavailableError(absl::StrCat(
            member_.name, " said bye: ", std::get<Bye>(frame.body).reason)));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown frame kind");
}

absl::Status RemoteTransferEngine::HandleStepDones(
    std::vector<StepDone> dones) {
  {
    MutexLock lock(&mu_);
    if (!failure_.ok()) return absl::OkStatus();  // Already reported.
    // Check the whole frame before taking anything from it.
    absl::flat_hash_map<Site, int64_t> claimed;
    for (const StepDone& done : dones) {
      const Site site{done.op_id, done.direction, done.rank, done.step};
      if (!Serves(done.rank)) {
        return absl::InvalidArgumentError(
            absl::StrCat("completion for rank ", done.rank, ", which ",
                         member_.name, " does not serve"));
      }
      auto it = outstanding_.find(site);
      const int64_t taken = ++claimed[site];
      if (it == outstanding_.end() ||
          static_cast<int64_t>(it->second.size()) < taken) {
        return absl::InvalidArgumentError(
            absl::StrCat("completion for op ", done.op_id, " ",
                         DirName(done.direction), " rank ", done.rank, " step ",
                         done.step, ", which is not outstanding"));
      }
    }
    for (const auto& [site, n] : claimed) {
      for (int64_t i = 0; i < n; ++i) ResolveLocked(site);
    }
    stats_.steps_completed += static_cast<int64_t>(dones.size());
  }
  for (StepDone& done : dones) listener_->OnStepDone(std::move(done));
  Delivered(static_cast<int64_t>(dones.size()));
  return absl::OkStatus();
}

void RemoteTransferEngine::ResolveLocked(const Site& site) {
  auto it = outstanding_.find(site);
  const uint64_t serial = it->second.front();
  it->second.erase(it->second.begin());
  if (it->second.empty()) outstanding_.erase(it);
  waiting_[serial - waiting_base_].done = true;
  while (!waiting_.empty() && waiting_.front().done) {
    waiting_.pop_front();
    ++waiting_base_;
  }
}

void RemoteTransferEngine::Delivered(int64_t n) {
  MutexLock lock(&mu_);
  in_flight_ -= n;
  if (in_flight_ == 0) idle_cv_.SignalAll();
}

void RemoteTransferEngine::Fail(const absl::Status& cause) {
  const absl::Status why = cause.ok()
                               ? absl::UnknownError("failed without a cause")
                               : CopyStatus(cause);
  std::vector<StepDone> failed;
  {
    MutexLock lock(&mu_);
    if (!failure_.ok()) return;
    failure_ = CopyStatus(why);
    // In submission order.
    for (const Waiting& w : waiting_) {
      if (!w.done) failed.push_back(Unavailable(w.site, why));
    }
    outstanding_.clear();
    waiting_base_ += waiting_.size();
    waiting_.clear();
    digest_pending_.reset();
    outbox_.clear();  // Their steps were outstanding: reported below.
    stats_.steps_failed += static_cast<int64_t>(failed.size());
    if (!failed.empty() || !absl::IsCancelled(why)) {
      spdlog::error(
          "CP group: {} failed ({}); {} outstanding steps complete "
          "UNAVAILABLE",
          member_.name, why, failed.size());
    }
  }
  // The link first: once a step is reported failed, the member's link is
  // down (so is any heartbeat sent through it).
  link_->Abort(why);
  completer_.Complete(std::move(failed));
  // Only the first Fail gets here (failure_ is set once): told once, with
  // no lock of ours held (GroupLeader: MemberHealth::LinkFailed).
  if (on_failure_) on_failure_(why);
}

absl::Status RemoteTransferEngine::failure() const {
  MutexLock lock(&mu_);
  return CopyStatus(failure_);
}

absl::Status RemoteTransferEngine::SendControl(const FrameBody& body) {
  return link_->Send(body);
}

RemoteTransferEngine::Stats RemoteTransferEngine::stats() const {
  Stats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
    int64_t outstanding = 0;
    for (const auto& [site, serials] : outstanding_) {
      outstanding += static_cast<int64_t>(serials.size());
    }
    s.outstanding = outstanding;
  }
  s.link = link_->stats();
  return s;
}

void RemoteTransferEngine::Drain() {
  MutexLock lock(&mu_);
  while (in_flight_ > 0) idle_cv_.Wait(&mu_);
}

absl::StatusOr<uint64_t> RemoteTransferEngine::RegisterFence(
    Rank rank, const std::string& /*handle*/) {
  return absl::FailedPreconditionError(
      absl::StrCat("rank ", rank, " is served by ", member_.name,
                   ": its workers register their fences with that daemon"));
}

absl::Status RemoteTransferEngine::ReleaseFence(uint64_t fence) {
  return absl::NotFoundError(absl::StrCat("no fence ", fence));
}

absl::StatusOr<Rank> RemoteTransferEngine::FenceRank(uint64_t fence) const {
  return absl::NotFoundError(absl::StrCat("no fence ", fence));
}

}  // namespace hicache::group
