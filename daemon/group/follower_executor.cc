#include "daemon/group/follower_executor.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "daemon/group/step_completer.h"
#include "spdlog/spdlog.h"

namespace hicache::group {
namespace {

constexpr size_t kDonesBudget = comm::kMaxFrameBytes - kFrameHeaderBytes - 4;
// A completion's message and fence are cut to this, so one always fits.
constexpr size_t kMaxTextBytes = 4096;

}  // namespace

FollowerExecutor::FollowerExecutor(FollowerScope scope,
                                   std::unique_ptr<comm::Communicator> link,
                                   uint64_t epoch,
                                   const TransferEngineFactory& make_local,
                                   ControlHandler on_control,
                                   FailureHandler on_failure)
    : scope_(std::move(scope)),
      bounds_{.serves =
                  [ranks = scope_.ranks](Rank rank) {
                    return std::find(ranks.begin(), ranks.end(), rank) !=
                           ranks.end();
                  },
              .num_steps = scope_.num_steps,
              .device_pages_per_rank = scope_.device_pages_per_rank,
              .host_pages_per_rank = scope_.host_pages_per_rank,
              .refuse_fences = true,  // The leader cannot name ours.
              .refuse_repeated_ranks = true},
      on_control_(std::move(on_control)),
      on_failure_(std::move(on_failure)),
      tally_(scope_.ranks, scope_.device_pages_per_rank,
             scope_.host_pages_per_rank),
      link_(std::make_unique<WireLink>(std::move(link), epoch)),
      local_(make_local(this)),
      sender_([this] { SenderLoop(); }) {}

FollowerExecutor::~FollowerExecutor() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    send_cv_.SignalAll();
  }
  sender_.join();
  link_.reset();   // No task arrives after this.
  local_.reset();  // Finishes the copies; their answers go nowhere.
}

absl::Status FollowerExecutor::Start() {
  return link_->Start(
      [this](Frame frame) { return OnFrame(std::move(frame)); },
      [this](const absl::Status& cause) { OnLinkFailure(cause); });
}

absl::Status FollowerExecutor::SendControl(const FrameBody& body) {
  return link_->Send(body);
}

void FollowerExecutor::OnLinkFailure(const absl::Status& cause) {
  {
    MutexLock lock(&mu_);
    link_failed_ = true;
    pending_ -= static_cast<int64_t>(outbox_.size());
    outbox_.clear();
    if (pending_ == 0) idle_cv_.SignalAll();
  }
  if (!absl::IsCancelled(cause)) {
    spdlog::error("CP group: link to {} failed: {}", scope_.leader, cause);
  }
  ReportFailure(cause);
}

void FollowerExecutor::ReportFailure(const absl::Status& cause) {
  {
    MutexLock lock(&mu_);
    if (failure_reported_) return;
    failure_reported_ = true;
  }
  if (on_failure_) on_failure_(CopyStatus(cause));
}

void FollowerExecutor::SkewTallyForTesting(Rank rank, int64_t pages) {
  MutexLock lock(&mu_);
  skews_.emplace_back(rank, pages);
}

absl::Status FollowerExecutor::HandleDigest(const Digest& digest) {
  {
    MutexLock lock(&mu_);
    for (const auto& [rank, pages] : skews_) tally_.SkewForTesting(rank, pages);
    skews_.clear();
  }
  Digest mine = tally_.Snapshot();
  const std::string diff = DescribeDivergence(digest.tasks_frames, digest.ranks,
                                              mine.tasks_frames, mine.ranks);
  const bool match = diff.empty();
  // Counted before the answer goes out: whoever sees the answer sees it
  // counted (follower_executor_test read the stats after the result and,
  // under ASan, found 0).
  {
    MutexLock lock(&mu_);
    ++stats_.digests_checked;
    if (match) {
      ++stats_.digests_matched;
      stats_.last_digest_match = absl::Now();
    } else {
      diverged_ = true;
      stats_.diverged = true;
    }
  }
  absl::Status sent = link_->Send(DigestResult{
      .tasks_frames = mine.tasks_frames, .match = match, .ranks = mine.ranks});
  if (!sent.ok()) {
    // The link failed: on_failure follows (or ran).
    spdlog::debug("CP group: digest result to {} not sent: {}", scope_.leader,
                  sent);
  }
  if (match) return absl::OkStatus();
  spdlog::error(
      "CP group: pool accounting diverged from {}'s at tasks frame {}: {}. "
      "Leader's view: {}. This follower's view: {}",
      scope_.leader, digest.tasks_frames, diff, DescribeTallies(digest.ranks),
      DescribeTallies(mine.ranks));
  ReportFailure(absl::DataLossError(
      absl::StrCat("CP group pool accounting diverged from the leader's at "
                   "tasks frame ",
                   digest.tasks_frames, ": ", diff)));
  return absl::OkStatus();
}

absl::Status FollowerExecutor::OnFrame(Frame frame) {
  switch (frame.header.kind) {
    case FrameKind::kTasks:
      tally_.CountFrame();
      for (TransferTask& task : std::get<TaskBatch>(frame.body).tasks) {
        Execute(std::move(task));
      }
      return absl::OkStatus();
    case FrameKind::kStepDones:
      return absl::InvalidArgumentError("the leader sent a step_dones frame");
    case FrameKind::kDigest:
      return HandleDigest(std::get<Digest>(frame.body));
    case FrameKind::kDigestResult:
      return absl::InvalidArgumentError(
          "the leader sent a digest_result frame");
    case FrameKind::kHello:
    case FrameKind::kHeartbeat:
    case FrameKind::kBye:
    // Worker events and acks (kinds 6-8): the control handler's.
    case FrameKind::kWorkerEvents:
    case FrameKind::kLayerStored:
    case FrameKind::kLayerStoredAck:
      return on_control_ ? on_control_(frame) : absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown frame kind");
}

void FollowerExecutor::Execute(TransferTask task) {
  TransferTask run{
      .op_id = task.op_id, .direction = task.direction, .step = task.step};
  std::vector<StepDone> refused;
  bool diverged = false;
  {
    MutexLock lock(&mu_);
    diverged = diverged_;
  }
  // Every copy is checked before any is moved out of the task (a check
  // looks at the copies before it: a rank named twice).
  std::vector<absl::Status> checks(task.ranks.size());
  if (!diverged) {
    for (size_t i = 0; i < task.ranks.size(); ++i) {
      checks[i] = CheckRankCopy(bounds_, task, i);
    }
  }
  for (size_t i = 0; i < task.ranks.size(); ++i) {
    RankCopy& copy = task.ranks[i];
    if (diverged) {
      // Nothing runs once the accounting diverged (the daemon is exiting).
      refused.push_back(FailedStep(
          task, copy.rank,
          absl::AbortedError(
              "not executed: this follower's pool accounting diverged from "
              "the leader's")));
      continue;
    }
    const absl::Status& ok = checks[i];
    if (ok.ok()) {
      tally_.Add(task.op_id, task.direction, task.step, copy);
      run.ranks.push_back(std::move(copy));
      continue;
    }
    tally_.AddRefused(copy.rank);
    absl::Status why = absl::InvalidArgumentError(
        absl::StrCat("follower refused op ", task.op_id, " step ", task.step,
                     ": ", ok.message()));
    spdlog::error("CP group: {} (from {}); not executed", why.message(),
                  scope_.leader);
    refused.push_back(FailedStep(task, copy.rank, std::move(why)));
  }
  const int64_t accepted = static_cast<int64_t>(run.ranks.size());
  {
    MutexLock lock(&mu_);
    ++stats_.tasks_received;
    stats_.steps_refused += static_cast<int64_t>(refused.size());
    pending_ += accepted + static_cast<int64_t>(refused.size());
  }
  Answer(std::move(refused));
  if (accepted == 0) return;
  std::vector<Rank> ranks;
  for (const RankCopy& copy : run.ranks) ranks.push_back(copy.rank);
  absl::Status submitted = local_->Submit(std::move(run));
  if (submitted.ok()) return;
  spdlog::error("CP group: local engine refused op {} step {}: {}", task.op_id,
                task.step, submitted);
  std::vector<StepDone> rejected;
  for (Rank rank : ranks) {
    rejected.push_back(FailedStep(task, rank, CopyStatus(submitted)));
  }
  {
    MutexLock lock(&mu_);
    stats_.steps_rejected += accepted;
  }
  Answer(std::move(rejected));
}

void FollowerExecutor::OnStepDone(StepDone done) {
  {
    MutexLock lock(&mu_);
    ++stats_.steps_executed;
  }
  std::vector<StepDone> one;
  one.push_back(std::move(done));
  Answer(std::move(one));
}

void FollowerExecutor::Answer(std::vector<StepDone> dones) {
  if (dones.empty()) return;
  for (StepDone& done : dones) {
    // A representation of its own (CopyStatus), cut to the bound.
    done.status = absl::Status(done.status.code(),
                               done.status.message().substr(0, kMaxTextBytes));
    if (done.fence.size() > kMaxTextBytes) done.fence.clear();
  }
  MutexLock lock(&mu_);
  if (link_failed_) {
    pending_ -= static_cast<int64_t>(dones.size());
    if (pending_ == 0) idle_cv_.SignalAll();
    return;
  }
  for (StepDone& done : dones) outbox_.push_back(std::move(done));
  send_cv_.SignalAll();
}

void FollowerExecutor::SenderLoop() {
  while (true) {
    std::vector<StepDone> batch;
    {
      MutexLock lock(&mu_);
      while (outbox_.empty() && !stopping_) send_cv_.Wait(&mu_);
      if (outbox_.empty()) return;
      batch.swap(outbox_);
    }
    const int64_t n = static_cast<int64_t>(batch.size());
    int64_t frames = 0;
    int64_t bytes = 0;
    StepDoneBatch frame;
    size_t used = 0;
    auto flush = [&]() -> bool {
      if (frame.dones.empty()) return true;
      absl::Status sent = link_->Send(frame);
      ++frames;
      bytes += static_cast<int64_t>(kFrameHeaderBytes + 4 + used);
      frame.dones.clear();
      used = 0;
      return sent.ok();
    };
    bool ok = true;
    for (StepDone& done : batch) {
      const size_t size = EncodedStepDoneBytes(done);
      if (used + size > kDonesBudget && !(ok = flush())) break;
      frame.dones.push_back(std::move(done));
      used += size;
    }
    if (ok) ok = flush();
    MutexLock lock(&mu_);
    if (ok) {
      stats_.done_frames += frames;
      stats_.done_frame_bytes += bytes;
    }
    // A failed send means the link failed: on_failure follows (or ran).
    pending_ -= n;
    if (pending_ == 0) idle_cv_.SignalAll();
  }
}

void FollowerExecutor::Drain() {
  MutexLock lock(&mu_);
  while (pending_ > 0) idle_cv_.Wait(&mu_);
}

int64_t FollowerExecutor::refused() const {
  MutexLock lock(&mu_);
  return stats_.steps_refused;
}

FollowerExecutor::Stats FollowerExecutor::stats() const {
  Stats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
    s.pending = pending_;
  }
  s.link = link_->stats();
  return s;
}

}  // namespace hicache::group
