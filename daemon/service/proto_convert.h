#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/core/build_info.h"
#include "daemon/core/daemon_config.h"
#include "daemon/group/group_status.h"
#include "grpcpp/support/status.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::service {

// Domain -> proto conversions used by the service handlers.
v1::Backend ToProto(BackendKind backend);
v1::HostLayout ToProto(HostLayout layout);
void ToProto(const BuildInfo& build, v1::BuildInfo* out);
void ToProto(const DaemonConfig& config, v1::PoolGeometry* out);
// A CP group's snapshot (GetStatsResponse.cp_group). `leader_address` is
// the leader's gRPC target as this daemon knows it ("" when unknown). Each
// member's ranks come out ascending; health is "live", "dead" (not live,
// with a reason) or "unknown" (not live, no reason: not heard from yet); the
// last-heard age is in whole milliseconds, negative ages clamped to 0.
// A leader's members carry `transfer` (and `events` when worker events are
// forwarded) when GroupStatus has them; a follower's status carries
// `follower`. Digest-match ages are whole milliseconds, -1 for "never".
void ToProto(const group::GroupStatus& status, absl::string_view leader_address,
             v1::CpGroupStatus* out);

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace hicache::service
