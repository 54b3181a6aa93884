#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/group/copy_digest.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/wire_link.h"
#include "daemon/transfer/transfer_engine.h"
#include "daemon/transfer/transfer_task_check.h"

namespace hicache::group {

// What a follower serves: the bounds every copy the leader asks for must
// stay inside.
struct FollowerScope {
  std::string leader;       // For logs: "leader at 10.0.0.1:7070".
  std::vector<Rank> ranks;  // Ranks this daemon serves (has pools for).
  uint32_t num_steps = 0;   // KvGeometry::NumSteps().
  int64_t device_pages_per_rank = 0;
  int64_t host_pages_per_rank = 0;
};

// FollowerExecutor: the follower's end of the leader's RemoteTransferEngine
// (docs/cp-groups.md, "Wire format and remote transfers"). It runs the
// copies the leader sends on a transfer engine of its own over this
// daemon's pools, and sends the completions back.
//
// Contract:
//  * Tasks frames are handled on the link's thread, in order. Each rank copy
//    is checked (CheckRankCopy over the scope): a rank this daemon serves,
//    named once in its task, a step inside the geometry, paired page lists,
//    every page inside its pool, no fence (the leader cannot name this
//    daemon's fences). A copy that fails is never executed: it is logged at
//    error level, counted (refused()), and answered with a StepDone carrying
//    INVALID_ARGUMENT "follower refused op 5 step 2: <the check's message>".
//    The others are submitted to the local engine (one Submit per task); if
//    it refuses them, each is answered with its error.
//  * Completions (the local engine's and the refusals) are batched: a sender
//    thread puts whatever accumulated since its last flush into one
//    StepDones frame (several when they would exceed comm::kMaxFrameBytes).
//  * Frames other than Tasks: Hello, Heartbeat and Bye go to `on_control`
//    (non-OK: protocol error); without one they are ignored. A StepDones
//    frame from the leader is a protocol error (the link is aborted).
//  * Accounting digest (docs/cp-groups.md, "Step deadline and accounting
//    digest"): every rank copy that passed the checks is tallied, every
//    refused one counted (CopyTally), in frame order on the link's thread.
//    A Digest from the leader is compared with these tallies as of the
//    same Tasks frame (frames are ordered, so they are exact) and answered
//    with a DigestResult (match or not, and this side's tallies). On a
//    mismatch -- refused copies count as one -- it logs both views at
//    error level, executes nothing more (later copies are answered
//    ABORTED) and reports DATA_LOSS "CP group pool accounting diverged from
//    the leader's at tasks frame N: ..." through `on_failure`, which the
//    group layer makes fatal. The link stays up so that the result reaches
//    the leader, which fails the member on its side.
//  * `on_failure` is called once: when the link fails (the group layer
//    makes that fatal for the daemon) or the accounting diverged, whichever
//    comes first. Copies already running finish; after a link failure their
//    completions are dropped.
//  * Drain waits until every copy accepted so far was answered (its
//    StepDone handed to the link, or dropped because the link failed).
//  * The destructor stops the sender, closes the link, then destroys the
//    local engine (which finishes its copies).
//
// Thread-safe. Lock order: mu_ is a leaf; neither the local engine nor the
// link is called with it held.
class FollowerExecutor final : public TransferListener {
 public:
  using ControlHandler = std::function<absl::Status(const Frame& frame)>;
  using FailureHandler = std::function<void(const absl::Status& cause)>;

  struct Stats {
    int64_t tasks_received = 0;
    int64_t steps_executed = 0;  // Completed by the local engine.
    int64_t steps_refused = 0;   // Failed the checks; never executed.
    int64_t steps_rejected = 0;  // Refused by the local engine's Submit.
    int64_t done_frames = 0;
    int64_t done_frame_bytes = 0;
    int64_t pending = 0;
    int64_t digests_checked = 0;
    int64_t digests_matched = 0;
    bool diverged = false;
    // Wall-clock time of the last matching digest; InfinitePast if none.
    absl::Time last_digest_match = absl::InfinitePast();
    WireLink::Stats link;
  };

  // Builds the local engine with `make_local` (the executor is its
  // listener). `link` is the link to the leader, not started yet.
  FollowerExecutor(FollowerScope scope,
                   std::unique_ptr<comm::Communicator> link, uint64_t epoch,
                   const TransferEngineFactory& make_local,
                   ControlHandler on_control = nullptr,
                   FailureHandler on_failure = nullptr);
  ~FollowerExecutor() override ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Start();
  absl::Status SendControl(const FrameBody& body);
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Copies refused by the checks so far.
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);
  // Tests: the next digest comparison sees `pages` more device->host pages
  // on `rank` than were copied (an injected divergence).
  void SkewTallyForTesting(Rank rank, int64_t pages) ABSL_LOCKS_EXCLUDED(mu_);

  // TransferListener: the local engine's completions.
  void OnStepDone(StepDone done) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status OnFrame(Frame frame) ABSL_LOCKS_EXCLUDED(mu_);
  void Execute(TransferTask task) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HandleDigest(const Digest& digest) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls on_failure_ unless it was called already.
  void ReportFailure(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  void Answer(std::vector<StepDone> dones) ABSL_LOCKS_EXCLUDED(mu_);
  void SenderLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void OnLinkFailure(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);

  const FollowerScope scope_;
  // What each rank copy is checked against (scope_'s bounds, no fence, no
  // rank twice in a task).
  const TransferTaskBounds bounds_;
  const ControlHandler on_control_;
  const FailureHandler on_failure_;

  mutable Mutex mu_;
  CondVar send_cv_;
  CondVar idle_cv_;
  std::vector<StepDone> outbox_ ABSL_GUARDED_BY(mu_);
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // Accepted, not answered.
  bool link_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool failure_reported_ ABSL_GUARDED_BY(mu_) = false;
  bool diverged_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<Rank, int64_t>> skews_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  // The link thread's own (Tasks and Digest frames arrive there, in order).
  CopyTally tally_;

  std::unique_ptr<WireLink> link_;
  std::unique_ptr<TransferEngine> local_;
  std::thread sender_;
};

}  // namespace hicache::group
