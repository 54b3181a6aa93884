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
