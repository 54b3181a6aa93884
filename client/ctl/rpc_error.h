#pragma once

#include <string>

#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace hicache::ctl {

// What an RPC error means for the user, on one line without "hicachectl: ":
// the gRPC code in words, the daemon's message, then what to do, e.g.
//   PERMISSION_DENIED: DumpTree is an operator RPC; ... (operator RPCs need
//   root or hicached --operator_uids/--operator_gids; see docs/security.md)
//   UNAVAILABLE: no daemon at /run/h.sock (is hicached running? check
//   --socket or --target)
//   FAILED_PRECONDITION: not the CP group leader; ... (this daemon is a CP
//   group follower; the leader is 10.0.0.1:7070 (use --target
//   10.0.0.1:7070))
// `socket_path` is the unix socket tried ("" for TCP targets), `target` the
// gRPC target, `timeout` the per-call deadline. `leader` is the leader a
// FAILED_PRECONDITION named (LeaderOfCall); it is shown only when it is a
// valid redirect target (client::IsValidLeaderTarget), never otherwise.
std::string DescribeRpcError(const grpc::Status& status,
                             const std::string& target,
                             const std::string& socket_path,
                             absl::Duration timeout,
                             const std::string& leader = "");

// The leader a refused call named: the single valid `hicache-leader`
// trailer of a FAILED_PRECONDITION (client::StatusOfCall's rule); "" for
// any other call, no trailer, several, or one that is not a valid target.
std::string LeaderOfCall(const grpc::Status& status,
                         const grpc::ClientContext& context);

// "PERMISSION_DENIED", "UNAVAILABLE", ...; "CODE_<n>" for unknown codes.
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace hicache::ctl
