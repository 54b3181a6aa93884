#include "daemon/main/leader_join_handler.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace hicache {

LeaderJoinHandler::LeaderJoinHandler(
    std::string group, std::string leader_name, group::GroupLeader* leader,
    ConnectFn connect, std::function<void(const std::string&)> on_link_done,
    absl::Duration reply_timeout)
    : group_(std::move(group)),
      leader_name_(std::move(leader_name)),
      leader_(leader),
      connect_(std::move(connect)),
      on_link_done_(std::move(on_link_done)),
      reply_timeout_(reply_timeout),
      thread_([this] { Loop(); }) {}

LeaderJoinHandler::~LeaderJoinHandler() {
  Shutdown();
  if (thread_.joinable()) thread_.join();
}

std::string LeaderJoinHandler::Prefix(const std::string& group,
                                      uint64_t epoch,
                                      const std::string& member_name) {
  return absl::StrCat("cp/", group, "/", epoch, "/", member_name, "/");
}

void LeaderJoinHandler::Shutdown() {
  std::deque<std::shared_ptr<Pending>> queued;
  {
    MutexLock lock(&mu_);
    shutting_down_ = true;
    queued.swap(queue_);
    work_cv_.SignalAll();
  }
  for (const std::shared_ptr<Pending>& pending : queued) {
    Answer(pending.get(),
           absl::UnavailableError("the CP group leader is shutting down"));
  }
}

absl::StatusOr<group::JoinReply> LeaderJoinHandler::Join(
    const std::string& member_name, const group::GroupGeometry& geometry) {
  auto pending = std::make_shared<Pending>();
  pending->name = member_name;
  pending->geometry = geometry;
  MutexLock lock(&mu_);
  if (shutting_down_) {
    return absl::UnavailableError("the CP group leader is shutting down");
  }
  if (queue_.size() >= kMaxQueued) {
    return absl::UnavailableError(absl::StrCat(
        kMaxQueued, " admissions already wait; join again later"));
  }
  queue_.push_back(pending);
  work_cv_.Signal();
  const absl::Time deadline = absl::Now() + reply_timeout_;
  while (!pending->answered) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    answer_cv_.WaitWithTimeout(&mu_, left);
  }
  if (!pending->answered) {
    pending->abandoned = true;
    // Not started yet: it leaves the queue now, so that Joins that gave up
    // behind a slow connect do not hold the queue's slots.
    if (!pending->started) {
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if (*it == pending) {
          queue_.erase(it);
          break;
        }
      }
    }
    return absl::UnavailableError(absl::StrCat(
        "no admission within ", absl::FormatDuration(reply_timeout_),
        " (another member's link is connecting); join again"));
  }
  return pending->reply;
}

void LeaderJoinHandler::Answer(Pending* pending,
                               absl::StatusOr<group::JoinReply> reply) {
  MutexLock lock(&mu_);
  if (pending->answered) return;
  pending->answered = true;
  pending->reply = std::move(reply);
  answer_cv_.SignalAll();
}

void LeaderJoinHandler::Loop() {
  while (true) {
    std::shared_ptr<Pending> pending;
    {
      MutexLock lock(&mu_);
      while (!shutting_down_ && queue_.empty()) work_cv_.Wait(&mu_);
      if (shutting_down_) return;
      pending = queue_.front();
      queue_.pop_front();
      if (pending->abandoned) continue;
      pending->started = true;
    }
    std::string prefix;
    absl::StatusOr<group::Admission> admitted = leader_->Admit(
        pending->name, pending->geometry,
        [&](const group::Admission& admission)
            -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
          prefix = Prefix(group_, admission.epoch, pending->name);
          Answer(pending.get(),
                 group::JoinReply{.member_index = admission.member_index,
                                  .epoch = admission.epoch,
                                  .rendezvous_prefix = prefix,
                                  .leader_name = leader_name_});
          return connect_(prefix);
        });
    if (!admitted.ok()) {
      bool replied = false;
      {
        MutexLock lock(&mu_);
        replied = pending->answered;
      }
      if (replied) {
        spdlog::warn(
            "CP group {}: member '{}' was answered but its link did not "
            "connect: {} (it joins again)",
            group_, absl::CEscape(pending->name), admitted.status().ToString());
      } else {
        spdlog::warn("CP group {}: member '{}' refused: {}", group_,
                     absl::CEscape(pending->name),
                     admitted.status().ToString());
      }
      Answer(pending.get(), admitted.status());
    } else {
      spdlog::info("CP group {}: member '{}' {} as member {} (epoch {})",
                   group_, absl::CEscape(pending->name),
                   admitted->readmitted ? "readmitted" : "admitted",
                   admitted->member_index, admitted->epoch);
    }
    if (!prefix.empty() && on_link_done_) on_link_done_(prefix);
  }
}

}  // namespace hicache
