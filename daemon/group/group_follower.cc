#include "daemon/group/group_follower.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
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
        Lost(absl::StrCat("the link failed: ", cause.ToString()));
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
  MutexLock lock(&mu_);
  if (health_ != nullptr) health_->Heard(frame.header.kind);
  return absl::OkStatus();
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
  }
  spdlog::error("{}", fatal.message());
  if (on_fatal_) on_fatal_(fatal);
}

FollowerExecutor::Stats GroupFollower::executor_stats() const {
  MutexLock lock(&mu_);
  return executor_view_ != nullptr ? executor_view_->stats()
                                   : FollowerExecutor::Stats{};
}

GroupStatus GroupFollower::Status() const {
  GroupStatus status{.name = options_.group_name,
                     .role = GroupRole::kFollower,
                     .cp_size = options_.cp_size};
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
  return status;
}

void GroupFollower::Stop() {
  MutexLock run(&run_mu_);
  std::unique_ptr<MemberHealth> health;
  {
    MutexLock lock(&mu_);
    if (stopping_ && executor_ == nullptr) return;
    stopping_ = true;
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
    {
      MutexLock lock(&mu_);
      executor_view_ = nullptr;
    }
    executor_.reset();  // Closes the link, joins its threads.
  }
}

}  // namespace hicache::group
