#pragma once

#include "absl/status/status.h"
#include "daemon/core/build_info.h"
#include "daemon/core/daemon_config.h"
#include "grpcpp/support/status.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::service {

// Domain -> proto conversions used by the service handlers.
v1::Backend ToProto(BackendKind backend);
v1::HostLayout ToProto(HostLayout layout);
void ToProto(const BuildInfo& build, v1::BuildInfo* out);
void ToProto(const DaemonConfig& config, v1::PoolGeometry* out);

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace hicache::service
