#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/step_completer.h"
#include "daemon/group/wire_link.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group {

// What the leader knows of one follower: the ranks it serves and (when
// known, from its Join) the bounds of its pools, so that a task the
// follower would refuse is refused here, synchronously, instead.
struct RemoteMember {
  std::string name;          // For logs: "follower 1 at 10.0.0.2:7070".
  std::vector<Rank> ranks;   // Served by the follower.
  uint32_t num_steps = 0;    // 0: not checked here.
  int64_t device_pages_per_rank = 0;  // 0: not checked here.
  int64_t host_pages_per_rank = 0;    // 0: not checked here.
};

// RemoteTransferEngine: the leader's TransferEngine for the ranks one
// follower serves (docs/cp-groups.md, "Wire format and remote transfers").
// The copies run on the follower (its FollowerExecutor); only copy lists
// and completions cross the link.
//
// Contract:
//  * Submit validates (every rank served by the follower and named once,
//    page lists paired, no fence, and the step and pages inside the
//    member's bounds when known; INVALID_ARGUMENT, nothing queued), records
//    each (op, direction, rank, step) as outstanding and queues the task.
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
//    silent follower holds it up until the group layer calls Fail.
//  * Fences: a worker of a remote rank registers its fences with its own
//    daemon, which waits on them itself, so RegisterFence answers
//    FAILED_PRECONDITION and a task naming a fence is refused.
//  * Frames that are not about transfers (Hello, Heartbeat, Bye) go to
//    `on_control` on the link's thread (a non-OK answer is a protocol
//    error). Without one, heartbeats are ignored and Bye fails the engine.
//    A Tasks frame from a follower is a protocol error.
//  * The destructor fails the engine with CANCELLED (reporting what is
//    outstanding), then joins its threads and closes the link. The listener
//    must outlive the engine.
//
// Thread-safe. Lock order: mu_ before the completer's and the link's locks;
// the listener is never called with mu_ held.
class RemoteTransferEngine final : public TransferEngine {
 public:
  using ControlHandler = std::function<absl::Status(const Frame& frame)>;

  struct Stats {
    int64_t tasks_submitted = 0;
    int64_t steps_submitted = 0;
    int64_t steps_completed = 0;  // Reported by the follower.
    int64_t steps_failed = 0;     // Reported UNAVAILABLE by Fail.
    int64_t task_frames = 0;
    int64_t task_frame_bytes = 0;
    int64_t outstanding = 0;
    WireLink::Stats link;
  };

  // `link` is the member's link, not started yet; `epoch` the member's.
  RemoteTransferEngine(RemoteMember member,
                       std::unique_ptr<comm::Communicator> link,
                       uint64_t epoch, TransferListener* listener,
                       ControlHandler on_control = nullptr);
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
  // The UNAVAILABLE completion of `site` after `cause`.
  StepDone Unavailable(const Site& site, const absl::Status& cause) const;
  void SenderLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Delivered(int64_t n) ABSL_LOCKS_EXCLUDED(mu_);

  const RemoteMember member_;
  TransferListener* const listener_;
  const ControlHandler on_control_;

  mutable Mutex mu_;
  CondVar send_cv_;
  CondVar idle_cv_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<Site, int64_t> outstanding_ ABSL_GUARDED_BY(mu_);
  // Steps submitted whose listener call has not returned.
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<TransferTask> outbox_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);

  StepCompleter completer_;
  // Destroyed before the completer (joins the link's threads, whose
  // handlers may still be reporting through it).
  const std::unique_ptr<WireLink> link_;
  std::thread sender_;  // Last: starts once everything above exists.
};

}  // namespace hicache::group
