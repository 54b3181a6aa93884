#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/group/group_wire.h"

namespace hicache::group {

struct MemberHealthOptions {
  // Names the peer in the reason and the logs ("follower 1 at
  // 10.0.0.2:7070").
  std::string peer;
  // Carried in each Heartbeat frame.
  uint32_t member_index = 0;
  // A Heartbeat is sent this often.
  absl::Duration interval = absl::Milliseconds(100);
  // The peer is declared dead when nothing was heard from it for this long.
  // Must exceed `interval` (a few times it, so that a delayed heartbeat is
  // not a death).
  absl::Duration timeout = absl::Seconds(1);
  // Measures silence and stamps heartbeats. Default: silence is measured on
  // a monotonic clock (a wall-clock step never fakes or hides a death) and
  // heartbeats carry the wall clock (Clock::Real()).
  const Clock* clock = nullptr;
  // Tests: no thread; the test calls Tick() after moving a FakeClock.
  bool manual = false;
};

// A point-in-time view, for GetStats.
struct MemberHealthSnapshot {
  bool dead = false;
  bool stopped = false;
  // The reason the peer was declared dead (empty while live).
  absl::StatusCode dead_code = absl::StatusCode::kOk;
  std::string dead_reason;
  bool heard_any = false;
  // Time since a frame was last heard (since Start while none was).
  absl::Duration last_heard_age = absl::ZeroDuration();
  int64_t heartbeats_sent = 0;
  int64_t heartbeats_received = 0;
  int64_t frames_heard = 0;  // Every kind, heartbeats included.
};

// MemberHealth: the liveness of the peer at the other end of one link
// (docs/cp-groups.md, "Handshake and health"). One per link, on both the
// leader and the follower.
//
// Contract:
//  * After Start, a Heartbeat (the clock's time, member_index) goes out
//    through `send` at once and then every `interval`, from the health
//    object's own thread, which waits on a condition with a deadline (never
//    polls).
//  * Heard(kind) records a frame from the peer (the link's frame handler
//    calls it for every frame). Any frame proves the peer alive. Frames
//    arrive in order on one thread, so a handler that holds a frame for long
//    delays the heartbeats behind it: handlers must stay well under the
//    timeout. Frames before Start are not counted (Start begins the silence
//    clock).
//  * The peer is declared dead -- `on_dead(reason)` called exactly once, on
//    the health thread (Tick's caller in manual mode), never inside Heard,
//    LinkFailed or Stop -- when the first of these happens:
//      - nothing was heard for `timeout` (since Start if nothing ever was):
//        UNAVAILABLE "CP group peer <peer>: nothing heard for <silence>
//        (timeout <timeout>) ...". With the real clock this is detected
//        within timeout + scheduling delay of the last frame heard, so
//        well within the bound timeout + interval;
//      - `send` refused a heartbeat (the link failed): UNAVAILABLE naming
//        the peer and the refusal;
//      - LinkFailed(cause) was called: UNAVAILABLE naming the peer and the
//        cause.
//    After it no heartbeat is sent and the thread ends.
//  * Stop() ends it (idempotent): when it returns no heartbeat is being
//    sent and on_dead is not running and never will (a death not yet
//    reported is not reported). It may be called from inside on_dead (it
//    then does not wait for itself). The destructor Stops; it must not run
//    on the health thread.
//
// `send` is called without any lock of this object held, from one thread at
// a time; it must not block for long (WireLink::Send only queues). `on_dead`
// may take the owner's locks and call Stop, snapshot, Heard and LinkFailed;
// since Stop waits for a running on_dead, the owner must then not call Stop
// while holding a lock that on_dead takes.
//
// Thread-safe. mu_ is a leaf.
class MemberHealth {
 public:
  using SendFn = std::function<absl::Status(const FrameBody& body)>;
  using DeadFn = std::function<void(const absl::Status& reason)>;

  // INVALID_ARGUMENT for a non-positive interval, a timeout not above the
  // interval, or a missing send or on_dead.
  static absl::StatusOr<std::unique_ptr<MemberHealth>> Create(
      MemberHealthOptions options, SendFn send, DeadFn on_dead);

  ~MemberHealth();
  MemberHealth(const MemberHealth&) = delete;
  MemberHealth& operator=(const MemberHealth&) = delete;

  // Starts the clock of silence and the heartbeats (the thread, unless
  // manual). FAILED_PRECONDITION if started twice or after Stop.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  // A frame of `kind` arrived from the peer. Ignored before Start and once
  // dead or stopped.
  void Heard(FrameKind kind) ABSL_LOCKS_EXCLUDED(mu_);
  // The link failed: the peer is declared dead with `cause` (no wait for the
  // timeout). Ignored once dead or stopped. Never waits (it takes mu_, a
  // leaf, and wakes the thread), so the owner may call it with its own
  // locks held, even one that on_dead takes: GroupLeader calls it under its
  // mu_ from a member's RemoteTransferEngine on_failure, GroupFollower under
  // its mu_ from its executor's on_failure.
  void LinkFailed(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  MemberHealthSnapshot snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& peer() const { return options_.peer; }

  // One round, at the clock's current time: declares the peer dead if it is
  // due, else sends a heartbeat if one is due. Returns how long until the
  // next round is due (InfiniteDuration once dead, stopped, or before
  // Start). The thread calls it; in manual mode the test does, from one
  // thread at a time.
  absl::Duration Tick() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  MemberHealth(MemberHealthOptions options, SendFn send, DeadFn on_dead);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  std::string CountsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Duration NextDueLocked(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MemberHealthOptions options_;
  const Clock* const clock_;        // Silence.
  const Clock* const stamp_clock_;  // Heartbeats' sender_time_ns.
  const SendFn send_;
  const DeadFn on_dead_;

  mutable Mutex mu_;
  CondVar wake_;       // Signalled by LinkFailed and Stop.
  CondVar tick_done_;  // Signalled when a Tick ends.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;
  // A Tick is running (sending, or calling on_dead) on tick_thread_.
  bool in_tick_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id tick_thread_ ABSL_GUARDED_BY(mu_);
  // LinkFailed's cause, for the next round to report (code, message: a
  // representation of its own, see CopyStatus).
  bool link_failed_ ABSL_GUARDED_BY(mu_) = false;
  absl::StatusCode link_failed_code_ ABSL_GUARDED_BY(mu_) =
      absl::StatusCode::kOk;
  std::string link_failed_message_ ABSL_GUARDED_BY(mu_);
  absl::StatusCode dead_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  std::string dead_reason_ ABSL_GUARDED_BY(mu_);
  absl::Time started_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_heard_ ABSL_GUARDED_BY(mu_);  // started_at_ until heard.
  bool heard_any_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time next_send_ ABSL_GUARDED_BY(mu_);
  int64_t heartbeats_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t heartbeats_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t frames_heard_ ABSL_GUARDED_BY(mu_) = 0;
  // Set by Start (not manual); joined by Stop, or by the destructor when
  // Stop ran on it.
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::group
