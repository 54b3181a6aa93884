#pragma once

#include <string>

#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace hicache::ctl {

// What an RPC error means for the user, on one line without "hicachectl: ":
// the gRPC code in words, the daemon's message, then what to do, e.g.
//   PERMISSION_DENIED: DumpTree is an operator RPC; ... (operator RPCs need
//   root or hicached --operator_uids/--operator_gids; see docs/security.md)
//   UNAVAILABLE: no daemon at /run/h.sock (is hicached running? check
//   --socket or --target)
// `socket_path` is the unix socket tried ("" for TCP targets), `target` the
// gRPC target, `timeout` the per-call deadline.
std::string DescribeRpcError(const grpc::Status& status,
                             const std::string& target,
                             const std::string& socket_path,
                             absl::Duration timeout);

// "PERMISSION_DENIED", "UNAVAILABLE", ...; "CODE_<n>" for unknown codes.
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace hicache::ctl
