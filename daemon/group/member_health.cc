#include "daemon/group/member_health.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace hicache::group {
namespace {

// Time since an arbitrary origin that only moves forward, as an absl::Time.
class MonotonicClock final : public Clock {
 public:
  absl::Time Now() const override {
    return absl::UnixEpoch() +
           absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
};

const Clock* Monotonic() {
  static const MonotonicClock* const clock = new MonotonicClock;
  return clock;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MemberHealth>> MemberHealth::Create(
    MemberHealthOptions options, SendFn send, DeadFn on_dead) {
  if (options.interval <= absl::ZeroDuration() ||
      options.interval == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CP group health of ", options.peer,
                     ": heartbeat interval ",
                     absl::FormatDuration(options.interval),
                     " must be positive and finite"));
  }
  if (options.timeout <= options.interval ||
      options.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CP group health of ", options.peer, ": timeout ",
        absl::FormatDuration(options.timeout),
        " must be finite and above the heartbeat interval ",
        absl::FormatDuration(options.interval)));
  }
  if (!send || !on_dead) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CP group health of ", options.peer, ": no send or on_dead"));
  }
  return std::unique_ptr<MemberHealth>(
      new MemberHealth(std::move(options), std::move(send), std::move(on_dead)));
}

MemberHealth::MemberHealth(MemberHealthOptions options, SendFn send,
                           DeadFn on_dead)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Monotonic()),
      stamp_clock_(options_.clock != nullptr ? options_.clock
                                             : Clock::Real()),
      send_(std::move(send)),
      on_dead_(std::move(on_dead)) {}

MemberHealth::~MemberHealth() {
  Stop();
  std::thread thread;
  {
    MutexLock lock(&mu_);
    thread = std::move(thread_);  // Left by a Stop from inside on_dead.
  }
  if (thread.joinable()) thread.join();
}

absl::Status MemberHealth::Start() {
  const absl::Time now = clock_->Now();
  MutexLock lock(&mu_);
  if (started_ || stopped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("CP group health of ", options_.peer,
                     started_ ? ": started twice" : ": stopped"));
  }
  started_ = true;
  started_at_ = now;
  last_heard_ = now;
  next_send_ = now;  // The first heartbeat goes out at once.
  if (!options_.manual) thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void MemberHealth::Heard(FrameKind kind) {
  const absl::Time now = clock_->Now();
  MutexLock lock(&mu_);
  if (!started_ || stopped_ || dead_) return;
  last_heard_ = std::max(last_heard_, now);
  heard_any_ = true;
  ++frames_heard_;
  if (kind == FrameKind::kHeartbeat) ++heartbeats_received_;
}

void MemberHealth::LinkFailed(const absl::Status& cause) {
  MutexLock lock(&mu_);
  if (stopped_ || dead_ || link_failed_) return;
  link_failed_ = true;
  // A representation of its own (see CopyStatus in step_completer.h).
  link_failed_code_ = cause.code();
  link_failed_message_ = std::string(cause.message());
  wake_.SignalAll();
}

void MemberHealth::Stop() {
  const std::thread::id self = std::this_thread::get_id();
  std::thread thread;
  {
    MutexLock lock(&mu_);
    stopped_ = true;
    wake_.SignalAll();
    // From inside on_dead (or send): the round in progress is our caller;
    // the destructor joins the thread.
    if (in_tick_ && tick_thread_ == self) return;
    if (thread_.joinable() && thread_.get_id() == self) return;
    // Manual mode: a Tick in progress on another thread.
    while (in_tick_) tick_done_.Wait(&mu_);
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

MemberHealthSnapshot MemberHealth::snapshot() const {
  const absl::Time now = clock_->Now();
  MutexLock lock(&mu_);
  MemberHealthSnapshot s;
  s.dead = dead_;
  s.stopped = stopped_;
  s.dead_code = dead_code_;
  s.dead_reason = dead_reason_;
  s.heard_any = heard_any_;
  if (started_) s.last_heard_age = std::max(absl::ZeroDuration(), now - last_heard_);
  s.heartbeats_sent = heartbeats_sent_;
  s.heartbeats_received = heartbeats_received_;
  s.frames_heard = frames_heard_;
  return s;
}

std::string MemberHealth::CountsLocked() const {
  return absl::StrCat("heartbeats sent ", heartbeats_sent_, ", received ",
                      heartbeats_received_, ", frames heard ", frames_heard_);
}

absl::Duration MemberHealth::NextDueLocked(absl::Time now) const {
  if (!started_ || stopped_ || dead_) return absl::InfiniteDuration();
  if (link_failed_) return absl::ZeroDuration();
  const absl::Time due = std::min(next_send_, last_heard_ + options_.timeout);
  return std::max(absl::ZeroDuration(), due - now);
}

absl::Duration MemberHealth::Tick() {
  const absl::Time now = clock_->Now();
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string reason;
  bool send = false;
  {
    MutexLock lock(&mu_);
    if (!started_ || stopped_ || dead_ || in_tick_) {
      return absl::InfiniteDuration();
    }
    in_tick_ = true;
    tick_thread_ = std::this_thread::get_id();
    const absl::Duration silence = now - last_heard_;
    if (link_failed_) {
      code = absl::StatusCode::kUnavailable;
      reason = absl::StrCat(
          "CP group peer ", options_.peer, ": link failed: ",
          absl::Status(link_failed_code_, link_failed_message_).ToString());
    } else if (silence >= options_.timeout) {
      code = absl::StatusCode::kUnavailable;
      reason = absl::StrCat(
          "CP group peer ", options_.peer, ": nothing heard for ",
          absl::FormatDuration(silence), " (timeout ",
          absl::FormatDuration(options_.timeout), ")",
          heard_any_ ? "" : ", nothing at all since the health check started",
          "; ", CountsLocked());
    } else if (now >= next_send_) {
      send = true;
      next_send_ = now + options_.interval;
    }
  }
  if (send) {
    const absl::Status sent = send_(
        Heartbeat{.sender_time_ns = absl::ToUnixNanos(stamp_clock_->Now()),
                  .member_index = options_.member_index});
    MutexLock lock(&mu_);
    if (sent.ok()) {
      ++heartbeats_sent_;
    } else {
      code = absl::StatusCode::kUnavailable;
      reason = absl::StrCat("CP group peer ", options_.peer,
                            ": heartbeat could not be sent: ", sent.ToString(),
                            "; ", CountsLocked());
    }
  }
  bool declare = false;
  if (code != absl::StatusCode::kOk) {
    MutexLock lock(&mu_);
    if (!stopped_ && !dead_) {
      dead_ = true;
      dead_code_ = code;
      dead_reason_ = reason;
      declare = true;
    }
  }
  if (declare) {
    spdlog::warn("{}: declared dead", reason);
    on_dead_(absl::Status(code, reason));
  }
  const absl::Time after = clock_->Now();
  MutexLock lock(&mu_);
  in_tick_ = false;
  tick_done_.SignalAll();
  return NextDueLocked(after);
}

void MemberHealth::Run() {
  while (true) {
    const absl::Duration wait = Tick();
    MutexLock lock(&mu_);
    if (stopped_ || dead_) return;
    if (link_failed_) continue;
    // A LinkFailed or Stop after Tick returned is seen above (both under
    // mu_) or signals this wait.
    wake_.WaitWithTimeout(&mu_, wait);
  }
}

}  // namespace hicache::group
