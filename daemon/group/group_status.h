#pragma once

// A point-in-time view of a CP group from one daemon (docs/cp-groups.md,
// "Leader and follower"): what GetStats and hicachectl will show. Plain
// data; GroupLeader::Status and GroupFollower::Status fill it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/layout/cp_layout.h"

namespace hicache::group {

enum class GroupRole { kLeader, kFollower };

enum class GroupState {
  // Leader: some rank is not served by a live member yet and none died.
  // Follower: Run not called yet.
  kForming,
  // Leader: every rank of [0, C) is served by the leader or a live member.
  // Follower: the link to the leader is up.
  kFormed,
  // Leader: a member died and its ranks are not served again yet.
  // Follower: the leader was lost (on_fatal was called).
  kDegraded,
  // Stop() was called.
  kStopped,
};

// "leader", "follower".
const char* GroupRoleName(GroupRole role);
// "forming", "formed", "degraded", "stopped".
const char* GroupStateName(GroupState state);

// Leader only: the data path to one member, from its RemoteTransferEngine
// (docs/cp-groups.md, "Step deadline and accounting digest"). Kept, frozen,
// once the member died (until it is readmitted).
struct GroupMemberTransfer {
  int64_t steps_sent = 0;       // Steps submitted to the member.
  int64_t steps_completed = 0;  // Reported done by the member.
  int64_t steps_failed = 0;     // Completed UNAVAILABLE by a failure.
  int64_t outstanding = 0;      // Sent, not completed yet.
  int64_t step_timeouts = 0;    // Deadlines that failed the member (0 or 1).
  int64_t digests_sent = 0;
  int64_t digests_matched = 0;
  int64_t digest_divergences = 0;
  // Time since the last matching digest; InfiniteDuration if none yet.
  absl::Duration last_digest_match_age = absl::InfiniteDuration();
};

// Leader only: worker events forwarded to one member (EventForwarder's
// per-member counters). Kept, frozen, once the member was detached.
struct GroupMemberEvents {
  int64_t events_queued = 0;
  int64_t events_sent = 0;
  int64_t frames_sent = 0;
  int64_t events_waiting = 0;  // Queued, not sent yet.
  bool failed = false;         // The forwarder gave up on it.
};

// Follower only: what this follower's executor ran for the leader, and the
// worker acks it relayed (GroupFollower::ForwardLayerStored).
struct GroupFollowerCounters {
  int64_t tasks_received = 0;
  int64_t steps_executed = 0;  // Completed by the local engine.
  int64_t steps_refused = 0;   // Failed the executor's checks.
  int64_t steps_rejected = 0;  // Refused by the local engine's Submit.
  int64_t pending = 0;
  int64_t digests_checked = 0;
  int64_t digests_matched = 0;
  bool diverged = false;
  // Time since the last matching digest; InfiniteDuration if none yet.
  absl::Duration last_digest_match_age = absl::InfiniteDuration();
  // Worker acks relayed to the leader (sent on the link), and relayed acks
  // that did not end OK (not sent, no answer, the leader lost, or the
  // leader's answer was an error). Local argument refusals count in neither.
  int64_t acks_relayed = 0;
  int64_t acks_failed = 0;
};

struct GroupMemberStatus {
  // The leader is member 0; followers are numbered from 1 in the order
  // their ranks first joined (a readmitted member keeps its index).
  uint32_t index = 0;
  std::string name;
  std::vector<Rank> ranks;
  uint64_t epoch = 0;  // The link's epoch (0 for the leader itself).
  bool live = true;
  // Time since a frame was last heard from it (zero for the leader itself
  // or before its link started).
  absl::Duration last_heard_age = absl::ZeroDuration();
  // Why it was declared dead (empty while live).
  std::string reason;
  // Times it was admitted again after a death.
  int64_t readmissions = 0;
  int64_t heartbeats_sent = 0;
  int64_t heartbeats_received = 0;
  // Leader, members other than itself: set once it was admitted.
  bool has_transfer = false;
  GroupMemberTransfer transfer;
  // Leader, members other than itself, with an EventForwarder configured.
  bool has_events = false;
  GroupMemberEvents events;
};

struct GroupStatus {
  std::string name;
  GroupRole role = GroupRole::kLeader;
  GroupState state = GroupState::kForming;
  uint32_t cp_size = 0;
  // Leader: the last epoch handed out (0 before any admission).
  // Follower: the epoch of its link to the leader.
  uint64_t epoch = 0;
  // Leader: itself (index 0) then every member ever admitted, by index.
  // Follower: the leader (index 0), as seen from here.
  std::vector<GroupMemberStatus> members;
  // Follower: why the leader was lost (empty otherwise).
  std::string reason;
  int64_t deaths = 0;  // Leader: members declared dead so far.
  // Follower only (zero on a leader): its executor and relayed acks. Frozen
  // at their last values once Stop destroyed the executor.
  GroupFollowerCounters follower;
};

inline const char* GroupRoleName(GroupRole role) {
  return role == GroupRole::kLeader ? "leader" : "follower";
}

inline const char* GroupStateName(GroupState state) {
  switch (state) {
    case GroupState::kForming:
      return "forming";
    case GroupState::kFormed:
      return "formed";
    case GroupState::kDegraded:
      return "degraded";
    case GroupState::kStopped:
      return "stopped";
  }
  return "unknown";
}

}  // namespace hicache::group
