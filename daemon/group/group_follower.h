#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/event_hub.h"
#include "daemon/group/follower_executor.h"
#include "daemon/group/group_status.h"
#include "daemon/group/member_health.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group {

struct GroupFollowerOptions {
  std::string group_name;
  uint32_t cp_size = 0;
  // Names the leader in logs and in the fatal status ("leader at
  // 10.0.0.1:7070").
  std::string leader;
  // What this daemon serves: its ranks and pool bounds (FollowerScope's
  // `leader` is taken from above).
  FollowerScope scope;
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration heartbeat_timeout = absl::Seconds(1);
  // Worker events from the leader (docs/cp-groups.md, "Worker events and
  // acks across the link"). Optional: this daemon's EventHub, which its
  // local workers Subscribe to; every WorkerEvents frame is applied to it
  // (Tag(op, ns) at an op's first event, then the matching On* call). Must
  // outlive the follower.
  EventHub* events = nullptr;
};

// GroupFollower: the CP group as a follower daemon sees it
// (docs/cp-groups.md, "Leader and follower"): a FollowerExecutor running the
// leader's copies on this daemon's pools, and a MemberHealth watching the
// leader over the same link.
//
// Contract:
//  * Run(link, admission) starts both over the link the leader admitted
//    (epoch and member index from the leader's Admission). Once only:
//    FAILED_PRECONDITION afterwards or after Stop; INVALID_ARGUMENT for a
//    null link or bad heartbeat settings. A link that fails to start is
//    returned as is (on_fatal is not called for it).
//  * Losing the leader -- its health declares it dead (silence past the
//    timeout, a refused heartbeat), the link fails (including a protocol
//    error), or it says Bye -- calls `on_fatal` exactly once with
//    UNAVAILABLE "CP group <name> leader <leader> lost: <cause>", from a
//    thread of the link or the health, never inside Run or Stop. The
//    daemon turns it into an exit; on_fatal must not call Stop or destroy
//    the follower (it may take the daemon's locks and signal its main
//    thread). Not called once Stop began.
//  * Status() for GetStats: kForming before Run, kFormed while the leader is
//    live, kDegraded once it was lost (with the reason), kStopped after
//    Stop; the leader as member 0; `follower` holds the executor's counters
//    (frozen at Stop) and the relayed acks: relayed = sent to the leader,
//    failed = past the argument checks but not OK (not sent, unavailable,
//    no answer in time, or the leader's error).
//  * Worker events: a WorkerEvents frame from the leader is checked whole
//    (a per-rank event of a rank this follower does not hold is a protocol
//    error: the link dies, the leader is lost) and then applied, in order,
//    to options.events (if set), on the link's thread.
//  * ForwardLayerStored(ns, rank, step, ops) relays a local worker's
//    layer_stored to the leader and returns the leader's answer (its
//    SessionManager::NamespaceLayerStored status). INVALID_ARGUMENT, nothing
//    sent, for a rank this follower does not hold, more than
//    kMaxLayerStoredOps ops or a namespace over
//    kMaxLayerStoredNamespaceBytes; UNAVAILABLE before Run, once the leader
//    was lost or Stop began (waiters are woken), or when no answer came
//    within heartbeat_timeout. Waits on a condition; any thread but the
//    link's.
//  * Stop() (idempotent; the destructor calls it): says Bye to the leader,
//    stops the health, destroys the executor (closing the link, finishing
//    its copies). The local engine's pools must outlive the follower.
//
// Thread-safe. mu_ is a leaf except for MemberHealth::Heard and LinkFailed
// (a leaf) called under it; on_fatal, the executor and the rest of the
// health are called without it.
class GroupFollower {
 public:
  using FatalFn = std::function<void(const absl::Status& cause)>;

  GroupFollower(GroupFollowerOptions options, TransferEngineFactory make_local,
                FatalFn on_fatal);
  ~GroupFollower();
  GroupFollower(const GroupFollower&) = delete;
  GroupFollower& operator=(const GroupFollower&) = delete;

  absl::Status Run(std::unique_ptr<comm::Communicator> leader_link,
                   uint64_t epoch, uint32_t member_index = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  GroupStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status ForwardLayerStored(const std::string& ns, Rank rank,
                                  uint32_t step,
                                  absl::Span<const uint64_t> ops)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Steps the executor refused or ran, for GetStats and tests (the last
  // values once Stop destroyed it).
  FollowerExecutor::Stats executor_stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Lost(absl::string_view cause) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status OnControl(const Frame& frame) ABSL_LOCKS_EXCLUDED(mu_);
  // Checks a WorkerEvents batch whole, then applies it to options_.events.
  absl::Status ApplyWorkerEvents(const WorkerEventBatch& batch)
      ABSL_LOCKS_EXCLUDED(events_mu_);
  // The executor's counters (last_executor_ once it is gone), read without
  // mu_ held: registered as a sender so that Stop waits for it.
  FollowerExecutor::Stats ReadExecutorStats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until no ForwardLayerStored uses executor_view_ outside mu_.
  void AwaitSendersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why ForwardLayerStored cannot reach the leader now.
  absl::Status UnavailableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupFollowerOptions options_;
  const TransferEngineFactory make_local_;
  const FatalFn on_fatal_;

  // Serializes Run and Stop (they build and destroy the pieces below).
  Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Built by Run, destroyed by Stop (after the health), under run_mu_;
  // executor_view_ lets Status read its stats under mu_ meanwhile.
  std::unique_ptr<FollowerExecutor> executor_ ABSL_GUARDED_BY(run_mu_);

  mutable Mutex mu_;
  bool ran_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<MemberHealth> health_ ABSL_GUARDED_BY(mu_);
  MemberHealthSnapshot last_health_ ABSL_GUARDED_BY(mu_);
  FollowerExecutor* executor_view_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The executor's counters when Stop destroyed it.
  FollowerExecutor::Stats last_executor_ ABSL_GUARDED_BY(mu_);
  // ForwardLayerStored calls sent to the leader, and those (past the
  // argument checks) that did not end OK.
  int64_t acks_relayed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t acks_failed_ ABSL_GUARDED_BY(mu_) = 0;

  // ForwardLayerStored: the answers awaited (nullopt until the ack came),
  // and the calls sending through executor_view_ without mu_.
  // An ack came, the leader was lost, stopping, or a sender or stats
  // reader left.
  mutable CondVar ack_cv_;
  uint64_t next_request_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::optional<absl::Status>> acks_
      ABSL_GUARDED_BY(mu_);
  // Also counts Status/executor_stats reading the executor's counters
  // without mu_ (its link's locks are not below mu_).
  mutable int64_t senders_ ABSL_GUARDED_BY(mu_) = 0;

  // Worker events: the ops tagged in options_.events whose terminal event
  // has not come yet (Tag replays queued events, so it runs once per op).
  // At most kMaxTaggedOps, oldest dropped first (tag_order_, which may hold
  // entries of ended ops too, up to twice that).
  static constexpr size_t kMaxTaggedOps = 4 * EventHub::kMaxOps;
  Mutex events_mu_;
  absl::flat_hash_set<uint64_t> tagged_ ABSL_GUARDED_BY(events_mu_);
  std::deque<uint64_t> tag_order_ ABSL_GUARDED_BY(events_mu_);
};

}  // namespace hicache::group
