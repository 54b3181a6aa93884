#pragma once

// The CP group settings of one daemon (docs/cp-groups.md): whether it leads
// or follows a group of daemons that together serve one CP group's ranks,
// and how the group's daemons reach each other. Plain value type; checked
// by DaemonConfig::Validate (which sees the rest of the configuration).

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace hicache {

struct CpGroupConfig {
  // The group's name (--cp_group); empty: not in a group (a standalone
  // daemon serves every rank of its CP group itself).
  std::string name;
  // A follower's leader: its gRPC TCP target "host:port" (--cp_group_leader).
  // Empty: this daemon leads.
  std::string leader;
  // The target the leader names in redirects (--cp_group_advertise). Empty:
  // listen_tcp with the port it bound.
  std::string advertise;
  // IP address the group's Gloo TCP links listen on (--cp_group_bind).
  std::string bind = "127.0.0.1";
  // This daemon's name in the group (--cp_group_member); empty: the
  // shared-memory instance id.
  std::string member;
  uint32_t heartbeat_ms = 100;
  uint32_t timeout_ms = 1000;
  // A follower tries to join this long, then exits non-zero.
  uint32_t join_timeout_ms = 60000;
  // Leader: a remote step not acknowledged within this fails its member
  // (0: no deadline).
  uint32_t step_timeout_ms = 10000;
  // Leader: how often each member's copy accounting is compared with the
  // leader's (0: never).
  uint32_t digest_interval_ms = 1000;

  bool enabled() const { return !name.empty(); }
  bool is_leader() const { return enabled() && leader.empty(); }

  // OK, or INVALID_ARGUMENT naming the field: the names' characters and
  // lengths, host:port targets, heartbeat_ms in [1, 60000] below
  // timeout_ms <= 600000, join_timeout_ms >= 1000. Nothing is checked
  // when the group is not enabled, except that leader, advertise and member
  // need a name.
  absl::Status Validate() const;
};

}  // namespace hicache
