#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/hicache_engine.h"
#include "absl/types/span.h"
#include "daemon/group/event_forwarder.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/group_status.h"
#include "daemon/group/member_health.h"
#include "daemon/group/remote_transfer_engine.h"
#include "daemon/group/routing_transfer_engine.h"

namespace hicache::group {

struct GroupLeaderOptions {
  std::string group_name;
  uint32_t cp_size = 0;
  // The leader's own geometry; `geometry.ranks` are the ranks whose pools
  // the leader holds (its pool_ranks). Every member must match the rest.
  GroupGeometry geometry;
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration heartbeat_timeout = absl::Seconds(1);
  // Optional: told of each death once it was handled (lanes unavailable
  // and dropped), with the member's index and the reason, on the thread
  // that handled it (the leader's own, or one inside Admit or Stop), with
  // the GroupLeader's ops lock held (and its admission lock when inside
  // Admit). It must only record or hand off: it must not call Admit, Stop
  // or AwaitDeathsHandled, nor wait for a thread that does.
  std::function<void(uint32_t member_index, const std::string& reason)>
      on_member_dead;
  // Worker events and acks across the link (docs/cp-groups.md). Optional:
  // the forwarder the leader's EventHub taps (SetSubscriberTap); every
  // admitted member is attached to it (its ranks, its link) and detached at
  // its death or Stop. A member it fails (events piling up, a failed send)
  // dies like any other. Must outlive the GroupLeader.
  EventForwarder* events = nullptr;
  // Optional: stores a member's relayed worker ack -- layer `step` of `ops`
  // written by its worker of `rank` in namespace `ns` (the daemon wires it
  // to SessionManager::NamespaceLayerStored). Called on the member's link
  // thread with no lock of the GroupLeader's held, only for a live member,
  // a rank it holds, at most kMaxLayerStoredOps ops and a namespace of at
  // most kMaxLayerStoredNamespaceBytes; its status is the member's ack.
  // Unset: every ack is UNIMPLEMENTED.
  std::function<absl::Status(const std::string& ns, Rank rank, uint32_t step,
                             absl::Span<const uint64_t> ops)>
      layer_stored;
  // Each member's RemoteTransferEngine: its step deadline and accounting
  // digest (docs/cp-groups.md, "Step deadline and accounting digest").
  RemoteTransferOptions remote;
};

// What an admission hands out: the member's index (stable across
// readmissions) and the epoch of its link (new on every admission).
struct Admission {
  uint32_t member_index = 0;
  uint64_t epoch = 0;
  bool readmitted = false;
};

// GroupLeader: the CP group as the leader daemon sees it (docs/cp-groups.md,
// "Leader and follower"). It admits members, routes their ranks to them
// through the engine's RoutingTransferEngine, watches their health, and
// turns a death into lanes the engine no longer serves.
//
// Contract:
//  * Created with the leader's geometry and ranks, the engine and the
//    RoutingTransferEngine the engine installed through wrap_transfer (both
//    must outlive the GroupLeader). Create marks every rank the leader does
//    not hold unavailable in the engine: until a member serves a rank, loads
//    miss and backups skip. State kForming.
//  * Admit(name, geometry, connect) checks the member's geometry
//    (CheckGeometry: FAILED_PRECONDITION naming every differing field) and
//    its ranks against the leader's and every LIVE member's
//    (CheckRankAssignment, kPartial: FAILED_PRECONDITION naming the live
//    member that holds a rank). A member taking exactly the ranks of a DEAD
//    member is readmitted in its slot (same index, readmissions + 1); one
//    that overlaps a dead member's ranks only in part is refused. On
//    success (the name may come from the member: it is C-escaped in every
//    message and log line) it hands out a new epoch and calls
//    `connect(admission)` for the link (the daemon's Gloo rendezvous; the
//    caller's own error is returned as is), then builds the member's
//    RemoteTransferEngine and MemberHealth over it, routes its ranks to it and
//    makes its lanes available. Once every rank is served by the leader or a
//    live member the state is kFormed. Admissions are serialized; nothing
//    changes when one is refused or `connect` fails (the epoch is used up).
//    `connect` runs with no lock held but the one serializing admissions, so
//    deaths are handled meanwhile; it must not call Admit or Stop. A Stop
//    during it makes the admission FAILED_PRECONDITION.
//  * A member dies -- its MemberHealth declares it (silence past the
//    timeout; its link failed: closed, broken, a protocol error, a refused
//    send, or its RemoteTransferEngine failing otherwise, which aborts the
//    link -- the engine's on_failure calls MemberHealth::LinkFailed, so the
//    death comes at once, not at the next heartbeat; a refused heartbeat)
//    or it says Bye -- exactly once per admission. Then, on the leader's
//    own thread, never inside a callback of the link, the health or the
//    engine: the member is marked dead with the reason (at once, visible
//    in Status), its RemoteTransferEngine fails (outstanding
//    steps complete UNAVAILABLE "CP group member <name> (ranks ...) lost:
//    <cause>"), its route is cleared, and the engine's
//    SetLaneAvailability(ranks, false) then DropLanes(ranks) run, so a
//    restarted member's fresh pools are never served stale. State kDegraded
//    until its ranks are served again.
//  * Status() is a snapshot (leader as member 0). Each admitted member
//    carries its RemoteTransferEngine's counters and its EventForwarder
//    sink's; a dead member's are those at its retirement. They are read
//    with no lock of the GroupLeader's held (the engine is kept alive by a
//    copy of its shared_ptr, taken under mu_).
//  * Stop() (idempotent; the destructor calls it): sends Bye to every live
//    member, fails their engines, clears their routes, marks their lanes
//    unavailable and drops them, joins every thread. Admit afterwards is
//    FAILED_PRECONDITION. Not a death (on_member_dead is not called). The
//    GroupLeader must not be destroyed while an Admit runs.
//
// Thread-safe. Lock order: admit_mu_ (one admission at a time, held across
// `connect`) before ops_mu_ (an admission's checks and install, deaths,
// Stop; the engine is called with it held, never with mu_) before mu_; mu_ is
// held only to read or change the members and to call MemberHealth::Heard
// and LinkFailed (whose lock is a leaf). Neither the engine nor the transfer
// engines call into GroupLeader with a lock of theirs held (a remote engine's
// on_failure runs with none of its locks held; with ops_mu_ held when
// RetireLocked or Admit failed it, which comes before mu_).
class GroupLeader {
 public:
  using ConnectFn =
      std::function<absl::StatusOr<std::unique_ptr<comm::Communicator>>(
          const Admission& admission)>;

  // INVALID_ARGUMENT for a null engine or routing engine, a cp_size that
  // differs from the geometry's, leader ranks that CheckRankAssignment
  // refuses, or heartbeat settings MemberHealth refuses.
  static absl::StatusOr<std::unique_ptr<GroupLeader>> Create(
      GroupLeaderOptions options, HiCacheEngine* engine,
      RoutingTransferEngine* routing);
  ~GroupLeader();
  GroupLeader(const GroupLeader&) = delete;
  GroupLeader& operator=(const GroupLeader&) = delete;

  absl::StatusOr<Admission> Admit(const std::string& member_name,
                                  const GroupGeometry& geometry,
                                  const ConnectFn& connect)
      ABSL_LOCKS_EXCLUDED(admit_mu_, ops_mu_, mu_);
  // The same with a link that is already connected (in-process tests, or a
  // transport whose link does not depend on the epoch). The link is
  // destroyed if the member is refused.
  absl::StatusOr<Admission> Admit(const std::string& member_name,
                                  const GroupGeometry& geometry,
                                  std::unique_ptr<comm::Communicator> link)
      ABSL_LOCKS_EXCLUDED(admit_mu_, ops_mu_, mu_);

  GroupStatus Status() const ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(ops_mu_, mu_);

  // Waits until every death noted so far was handled (lanes dropped). For
  // tests and orderly shutdown.
  void AwaitDeathsHandled() ABSL_LOCKS_EXCLUDED(ops_mu_, mu_);

 private:
  struct Member {
    uint32_t index = 0;
    std::string name;
    std::vector<Rank> ranks;
    uint64_t epoch = 0;
    bool live = false;
    // Live and its lanes made available: its ranks count as served.
    bool serving = false;
    std::string reason;
    int64_t readmissions = 0;
    std::shared_ptr<RemoteTransferEngine> remote;
    std::unique_ptr<MemberHealth> health;
    MemberHealthSnapshot last_health;  // Kept once the health is gone.
    uint64_t event_sink = 0;  // Its EventForwarder sink (0: none).
    // The counters of its engine and sink, frozen at its retirement (shown
    // until it is readmitted; Status reads the live ones otherwise).
    RemoteTransferEngine::Stats last_remote;
    std::optional<EventForwarder::SinkStats> last_events;
  };
  struct Death {
    uint32_t index;
    uint64_t epoch;
  };

  GroupLeader(GroupLeaderOptions options, HiCacheEngine* engine,
              RoutingTransferEngine* routing);

  // Marks the member of (index, epoch) dead with `cause` if it is the live
  // one, and queues its handling. Called from any thread.
  void NoteDeath(uint32_t index, uint64_t epoch, const absl::Status& cause)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Handles every queued death (engine calls).
  void HandleDeathsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes `member`'s engine and health away, fails the engine with `cause`,
  // and makes its lanes unavailable and dropped.
  void RetireLocked(const std::vector<Rank>& ranks,
                    std::shared_ptr<RemoteTransferEngine> remote,
                    std::unique_ptr<MemberHealth> health,
                    const absl::Status& cause, uint64_t event_sink)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status OnControl(uint32_t index, uint64_t epoch, const Frame& frame)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The member's RemoteTransferEngine failed (its link broke or was
  // aborted): its MemberHealth is told (LinkFailed), so that it is declared
  // dead at once rather than at its next heartbeat. On the thread that
  // failed the engine, which holds no lock of ours but possibly ops_mu_.
  void OnLinkFailed(uint32_t index, uint64_t epoch, const absl::Status& cause)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A member's relayed worker ack: checked, handed to options_.layer_stored,
  // acked with its status. On the member's link thread.
  void OnLayerStored(uint32_t index, uint64_t epoch,
                     const LayerStoredRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  GroupState StateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(ops_mu_, mu_);

  const GroupLeaderOptions options_;
  HiCacheEngine* const engine_;
  RoutingTransferEngine* const routing_;

  // Serializes admissions (held across their connect).
  Mutex admit_mu_ ABSL_ACQUIRED_BEFORE(ops_mu_);
  // Serializes what changes routes and lanes: an admission's checks and
  // install, deaths' handling, Stop.
  Mutex ops_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool stopped_ ABSL_GUARDED_BY(ops_mu_) = false;

  mutable Mutex mu_;
  CondVar wake_;     // Deaths queued, or stopping.
  CondVar handled_;  // A round of deaths was handled.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Member> members_ ABSL_GUARDED_BY(mu_);  // Index i + 1.
  std::deque<Death> deaths_ ABSL_GUARDED_BY(mu_);
  int64_t deaths_noted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t deaths_handled_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t last_epoch_ ABSL_GUARDED_BY(mu_) = 0;

  std::thread thread_;  // Last: handles deaths.
};

}  // namespace hicache::group
