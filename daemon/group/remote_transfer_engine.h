#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/group/copy_digest.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/step_completer.h"
#include "daemon/group/wire_link.h"
#include "daemon/transfer/transfer_engine.h"
#include "daemon/transfer/transfer_task_check.h"

namespace hicache::group {

// What the leader knows of one follower: the ranks it serves and (when
// known, from its Join) the bounds of its pools, so that a task the
// follower would refuse is refused here, synchronously, instead.
struct RemoteMember {
  std::string name;         // For logs: "follower 1 at 10.0.0.2:7070".
  std::vector<Rank> ranks;  // Served by the follower.
  uint32_t num_steps = 0;   // 0: not checked here.
  int64_t device_pages_per_rank = 0;  // 0: not checked here.
  int64_t host_pages_per_rank = 0;    // 0: not checked here.
};

// The engine's timers (docs/cp-groups.md, "Step deadline and accounting
// digest").
struct RemoteTransferOptions {
  // Once the oldest outstanding remote step, or the digest awaiting its
  // answer, has waited longer than this, the engine fails as on a link
  // failure (DEADLINE_EXCEEDED naming the op, rank, step and the wait).
  // Covers a follower whose link and heartbeats are alive but that never
  // answers. absl::InfiniteDuration() or <= 0: no deadline.
  absl::Duration step_timeout = absl::Seconds(10);
  // A Digest of the copies shipped goes out this often, after Tasks frames
  // were sent since the previous one (the first one interval after
  // construction, with or without traffic); one at a time. 0 (or less): no
  // digest.
  absl::Duration digest_interval = absl::Seconds(1);
  // Optional: told of each digest answered (the Tasks frames it covered and
  // whether the views matched), on the link's thread, after the engine
  // recorded it (and, on a mismatch, failed). Must not block or call back
  // into the engine's Submit/Drain.
  std::function<void(uint64_t tasks_frames, bool match)> on_digest;
};

// RemoteTransferEngine: the leader's TransferEngine for the ranks one
// follower serves (docs/cp-groups.md, "Wire format and remote transfers").
// The copies run on the follower (its FollowerExecutor); only copy lists
// and completions cross the link.
//
// Contract:
//  * Submit validates (CheckTransferTask, its messages after "<member
//    name>: ": every rank served by the follower and named once, page lists
//    paired, no fence, and the step and pages inside the member's bounds
//    when known; then each rank's copy fits one frame; INVALID_ARGUMENT,
//    nothing queued), records each (op, direction, rank, step) as
//    outstanding and queues the task.
//    It never blocks on the network and never calls the listener (the
//    engine calls it with its lock held). A sender thread batches whatever
//    accumulated since its last flush into one Tasks frame (several when
//    they would exceed comm::kMaxFrameBytes; a task is split by rank then).
//  * Completions: each StepDones frame from the follower is checked whole:
//    every completion must name a rank the follower serves and an
//    outstanding (op, direction, rank, step). If all do, each is handed to
//    the listener on the link's thread, in frame order; otherwise the frame
//    is a protocol error: none of it reaches the listener, the link is
//    aborted (logged at error level) and the engine fails as below.
//  * Fail(cause) -- the link failed, the follower said Bye, or the group
//    layer declared the member dead -- aborts the link and completes every
//    outstanding step with UNAVAILABLE (naming the member and the cause),
//    exactly once, from the engine's own completer thread; every later
//    Submit is accepted and completed the same way. A completion the
//    follower sends after that is dropped (its step was already reported).
//  * Drain waits until every submitted step was reported and its listener
//    call returned (through the follower, or through Fail). A live but
//    silent follower holds it up until the step deadline below fails it.
//  * Step deadline (options.step_timeout): the sender thread waits on its
//    condition until the earliest deadline (the oldest outstanding step's
//    submission, or the pending digest's sending, plus the timeout); with
//    nothing outstanding it waits without one. Past it the engine fails
//    exactly as Fail(DEADLINE_EXCEEDED "<member> did not answer op 5 d2h
//    rank 1 step 2 for 10.0s (step timeout 10s); 6 steps outstanding").
//    Fail aborts the link, and `on_failure` (below) tells the group layer
//    at once (GroupLeader: the member's MemberHealth::LinkFailed, which
//    declares it dead; GroupLeader drops its lanes).
//  * Accounting digest (options.digest_interval): the sender thread tallies
//    every rank copy it puts in a Tasks frame (CopyTally) and, between
//    frames, sends a Digest {Tasks frames so far, per-rank tallies}. The
//    follower answers with a DigestResult (its own tallies as of the same
//    frame). If the two differ, or the follower says they do, the engine
//    logs both views side by side at error level and fails with DATA_LOSS
//    "pool accounting diverged at tasks frame N: rank 3 pages
//    device->host: leader 1200, follower 1199" (the same path as the
//    deadline). A DigestResult with no digest outstanding, or a Digest from
//    the follower, is a protocol error.
//  * Fences: a worker of a remote rank registers its fences with its own
//    daemon, which waits on them itself, so RegisterFence answers
//    FAILED_PRECONDITION and a task naming a fence is refused.
//  * Frames that are not about transfers (Hello, Heartbeat, Bye) go to
//    `on_control` on the link's thread (a non-OK answer is a protocol
//    error). Without one, heartbeats are ignored and Bye fails the engine.
//    A Tasks frame from a follower is a protocol error.
//  * `on_failure` (optional) is told of the engine's failure exactly once,
//    with its cause, whatever failed it (the link's own failure: the peer
//    closed or died, a transport or a protocol error; a refused send; the
//    deadline; a divergence; Bye without on_control; Fail; the
//    destructor's CANCELLED): after the link was aborted, on the thread that
//    failed the engine (the link's, the sender's, or Fail's, Start's or the
//    destructor's caller), with no lock of the engine's held. It must not
//    block, and must not destroy the engine or wait for a thread of it.
//  * The destructor fails the engine with CANCELLED (reporting what is
//    outstanding), then joins its threads and closes the link. The listener
//    and what on_failure touches must outlive the engine.
//
// Thread-safe. Lock order: mu_ before the completer's and the link's locks;
// the listener is never called with mu_ held.
class RemoteTransferEngine final : public TransferEngine {
 public:
  using ControlHandler = std::function<absl::Status(const Frame& frame)>;
  using FailureHandler = std::function<void(const absl::Status& cause)>;

  struct Stats {
    int64_t tasks_submitted = 0;
    int64_t steps_submitted = 0;
    int64_t steps_completed = 0;  // Reported by the follower.
    int64_t steps_failed = 0;     // Reported UNAVAILABLE by Fail.
    int64_t task_frames = 0;
    int64_t task_frame_bytes = 0;
    int64_t outstanding = 0;
    int64_t digests_sent = 0;
    int64_t digests_matched = 0;
    int64_t digest_divergences = 0;
    int64_t step_timeouts = 0;  // Deadlines that failed the engine (0 or 1).
    // Wall-clock time of the last matching digest; InfinitePast if none.
    absl::Time last_digest_match = absl::InfinitePast();
    WireLink::Stats link;
  };

  // `link` is the member's link, not started yet; `epoch` the member's.
  RemoteTransferEngine(RemoteMember member,
                       std::unique_ptr<comm::Communicator> link, uint64_t epoch,
                       TransferListener* listener,
                       ControlHandler on_control = nullptr,
                       RemoteTransferOptions options = {},
                       FailureHandler on_failure = nullptr);
  ~RemoteTransferEngine() override ABSL_LOCKS_EXCLUDED(mu_);

  // Starts the link. A link that fails to start fails the engine.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);
  void Fail(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  // OK while the engine works; the cause once it failed.
  absl::Status failure() const ABSL_LOCKS_EXCLUDED(mu_);
  // Sends a control frame (Hello, Heartbeat, Bye) on the member's link.
  absl::Status SendControl(const FrameBody& body);

  const RemoteMember& member() const { return member_; }
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // TransferEngine.
  absl::Status Submit(TransferTask task) override ABSL_LOCKS_EXCLUDED(mu_);
  void Drain() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override;
  absl::Status ReleaseFence(uint64_t fence) override;
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override;

 private:
  using Clock = std::chrono::steady_clock;
  struct Site {
    uint64_t op_id;
    TransferDirection direction;
    Rank rank;
    uint32_t step;
    bool operator==(const Site&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Site& s) {
      return H::combine(std::move(h), s.op_id, s.direction, s.rank, s.step);
    }
  };

  absl::Status Validate(const TransferTask& task) const;
  bool Serves(Rank rank) const;
  absl::Status OnFrame(Frame frame) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HandleStepDones(std::vector<StepDone> dones)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HandleDigestResult(DigestResult result) ABSL_LOCKS_EXCLUDED(mu_);
  // One completion of `site` arrived: forgets its oldest submission.
  void ResolveLocked(const Site& site) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The deadline failure if one passed at `now`; else OK and `wake` lowered
  // to the earliest deadline.
  absl::Status OverdueLocked(Clock::time_point now,
                             Clock::time_point* wake) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a digest is due at `now` (sender thread); else `wake` lowered to
  // when it will be, if any.
  bool DigestDueLocked(Clock::time_point now, Clock::time_point* wake) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendDigest() ABSL_LOCKS_EXCLUDED(mu_);
  // The UNAVAILABLE completion of `site` after `cause`.
  StepDone Unavailable(const Site& site, const absl::Status& cause) const;
  void SenderLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Delivered(int64_t n) ABSL_LOCKS_EXCLUDED(mu_);

  const RemoteMember member_;
  // What Submit checks a task against (member_'s bounds, as far as known).
  const TransferTaskBounds bounds_;
  TransferListener* const listener_;
  const ControlHandler on_control_;
  const RemoteTransferOptions options_;
  const FailureHandler on_failure_;

  mutable Mutex mu_;
  CondVar send_cv_;
  CondVar idle_cv_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Each outstanding site's submissions (serials), oldest first.
  absl::flat_hash_map<Site, absl::InlinedVector<uint64_t, 1>> outstanding_
      ABSL_GUARDED_BY(mu_);
  // Every submission not yet answered, in submission (so deadline) order;
  // waiting_.front() has serial waiting_base_. Answered ones in the middle
  // are marked done and popped once they reach the front.
  struct Waiting {
    Site site;
    Clock::time_point since;
    bool done = false;
  };
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  uint64_t waiting_base_ ABSL_GUARDED_BY(mu_) = 0;
  // The digest awaiting the follower's answer.
  struct PendingDigest {
    Digest digest;
    Clock::time_point sent;
  };
  std::optional<PendingDigest> digest_pending_ ABSL_GUARDED_BY(mu_);
  // Steps submitted whose listener call has not returned.
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<TransferTask> outbox_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // The sender thread's own (read by it under mu_ too, never by others).
  CopyTally tally_;
  Clock::time_point last_digest_at_;
  uint64_t last_digest_frames_ = 0;
  bool digest_sent_ = false;

  StepCompleter completer_;
  // Destroyed before the completer (joins the link's threads, whose
  // handlers may still be reporting through it).
  const std::unique_ptr<WireLink> link_;
  std::thread sender_;  // Last: starts once everything above exists.
};

}  // namespace hicache::group
