#pragma once

#include <cstddef>
#include "absl/strings/string_view.h"

#include "daemon/group/leader_view.h"
#include "proto/leader_target.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace hicache::service {

// The redirect's wire contract (proto/leader_target.h), under the names
// the service uses.
using ::hicache::IsValidLeaderTarget;
using ::hicache::kLeaderTrailer;
using ::hicache::kMaxLeaderAddressBytes;

// The check of the tree RPCs (rpc_scope.h: kTree, and kByRole calls made as
// a scheduler). With no LeaderView (a standalone daemon) or on the leader
// every call passes. On a follower the call is refused, before it changes
// anything:
//   FAILED_PRECONDITION "not the CP group leader; the leader is <addr>",
//     with the trailing metadata `hicache-leader: <addr>`;
//   UNAVAILABLE while the leader is not known yet (no trailer);
//   FAILED_PRECONDITION without a trailer where the leader's address is not
//     a valid target (IsValidLeaderTarget).
// Thread-safe; `role` (may be null) must outlive the guard.
class LeaderGuard {
 public:
  explicit LeaderGuard(const LeaderView* role) : role_(role) {}

  // `rpc` is the method's name; one that rpc_scope.h does not list as kTree
  // or kByRole is INTERNAL (a handler guarded by mistake).
  grpc::Status Check(grpc::ServerContext* context,
                     absl::string_view rpc) const;

 private:
  const LeaderView* const role_;
};

}  // namespace hicache::service
