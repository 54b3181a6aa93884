#pragma once

// LeaderJoinHandler: the CP group leader's answer to a member's Join
// (daemon/group/join_handler.h; docs/cp-groups.md, "Bootstrap: Join and
// rendezvous").
//
// A Join must be answered before the member's link can connect: the member
// learns its epoch and rendezvous prefix from the reply, and only then
// starts its end of the Gloo rendezvous. So admissions run on this class's
// own thread, one at a time (GroupLeader::Admit serializes them anyway):
//
//   Join(name, geometry) -> queued -> the admission thread calls
//   GroupLeader::Admit, whose connect step first hands the reply (member
//   index, epoch, prefix "cp/<group>/<epoch>/<member>/") to the waiting
//   Join, then connects the leader's end of the link through `connect`.
//
// A refusal before the connect step (geometry, ranks, stopped leader) is
// Join's answer. A connect that fails after the reply went out changes
// nothing in the group but the epoch; it is logged, and the member, whose
// own connect fails too, joins again. Either way `on_link_done(prefix)`
// is called afterwards so the link's rendezvous keys can be reclaimed.
//
// Bounds, for a hostile or confused member: at most kMaxQueued admissions
// wait (UNAVAILABLE "retry" past it); a Join waits at most `reply_timeout`
// for its turn and its reply (UNAVAILABLE then, and its queued admission
// leaves the queue unless it already started).
//
// Thread-safe; no Join may still run when the handler is destroyed (stop
// the server first). Shutdown() (and the destructor) refuse later Joins, answer
// the queued ones UNAVAILABLE and join the thread; the connect in progress
// is not interrupted (it fails on its own timeout, or when the leader's
// rendezvous store shuts down).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/group/group_leader.h"
#include "daemon/group/join_handler.h"

namespace hicache {

class LeaderJoinHandler final : public group::JoinHandler {
 public:
  static constexpr size_t kMaxQueued = 16;

  // Connects the leader's end (link rank 0) of the link whose rendezvous
  // keys lie under `prefix`.
  using ConnectFn =
      std::function<absl::StatusOr<std::unique_ptr<comm::Communicator>>(
          const std::string& prefix)>;

  // `leader` must outlive this handler.
  LeaderJoinHandler(std::string group, std::string leader_name,
                    group::GroupLeader* leader, ConnectFn connect,
                    std::function<void(const std::string& prefix)> on_link_done,
                    absl::Duration reply_timeout = absl::Seconds(30));
  ~LeaderJoinHandler() override;
  LeaderJoinHandler(const LeaderJoinHandler&) = delete;
  LeaderJoinHandler& operator=(const LeaderJoinHandler&) = delete;

  absl::StatusOr<group::JoinReply> Join(const std::string& member_name,
                                        const group::GroupGeometry& geometry)
      override ABSL_LOCKS_EXCLUDED(mu_);

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // The prefix of a link's rendezvous keys.
  static std::string Prefix(const std::string& group, uint64_t epoch,
                            const std::string& member_name);

 private:
  struct Pending {
    std::string name;
    group::GroupGeometry geometry;
    // Under mu_: set once, by the admission thread or by Shutdown.
    bool answered = false;
    bool started = false;    // The admission thread took it.
    bool abandoned = false;  // Its Join gave up waiting.
    absl::StatusOr<group::JoinReply> reply = absl::UnknownError("unset");
  };

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  void Answer(Pending* pending, absl::StatusOr<group::JoinReply> reply)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string group_;
  const std::string leader_name_;
  group::GroupLeader* const leader_;
  const ConnectFn connect_;
  const std::function<void(const std::string&)> on_link_done_;
  const absl::Duration reply_timeout_;

  Mutex mu_;
  CondVar work_cv_;     // Queued work, or shutting down.
  CondVar answer_cv_;   // Some pending Join was answered.
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::shared_ptr<Pending>> queue_ ABSL_GUARDED_BY(mu_);

  std::thread thread_;  // Last: runs Loop().
};

}  // namespace hicache
