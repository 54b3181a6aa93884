#pragma once

// CP group leader redirects (docs/api.md, "CP group leader redirect"): a
// daemon that is a CP group follower refuses the tree RPCs with
// FAILED_PRECONDITION and names the leader in the gRPC trailing metadata
// `hicache-leader`. These helpers carry that name from a failed call into
// its absl::Status and back out; Session::OpenAt follows it.

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "proto/leader_target.h"

namespace hicache::client {

// The redirect's wire contract (proto/leader_target.h): the trailer that
// names the leader, the longest address accepted, and the rule a target
// must pass to be followed (the daemon applies the same rule to what it
// sends).
using ::hicache::IsValidLeaderTarget;
using ::hicache::kLeaderTrailer;
using ::hicache::kMaxLeaderAddressBytes;
// The absl::Status payload that carries it (the leader's target, as bytes).
inline constexpr char kLeaderPayloadUrl[] = "type.hicache.dev/leader";

// The absl::Status of a finished call (OK for OK): the gRPC code, the
// message prefixed with `what`, and, when the call was refused as
// FAILED_PRECONDITION with exactly one `hicache-leader` trailer that is a
// valid target, that target as the kLeaderPayloadUrl payload. An invalid
// or repeated trailer is not carried; the message then says so.
absl::Status StatusOfCall(const grpc::Status& status,
                          const grpc::ClientContext& context,
                          absl::string_view what);

// The leader a refused call named (StatusOfCall's payload), if any.
std::optional<std::string> LeaderOf(const absl::Status& status);

}  // namespace hicache::client
