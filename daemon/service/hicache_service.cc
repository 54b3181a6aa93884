#include "daemon/service/hicache_service.h"

#include <utility>

#include "absl/time/time.h"
#include "daemon/service/proto_convert.h"

namespace hicache::service {

HiCacheServiceImpl::HiCacheServiceImpl(DaemonInfo info, const Clock* clock)
    : info_(std::move(info)), clock_(clock) {}

grpc::Status HiCacheServiceImpl::GetStats(
    grpc::ServerContext* /*context*/, const v1::GetStatsRequest* /*request*/,
    v1::GetStatsResponse* response) {
  ToProto(info_.build, response->mutable_build());
  response->set_backend(ToProto(info_.config.backend));
  ToProto(info_.config, response->mutable_geometry());
  const absl::Duration uptime = clock_->Now() - info_.start_time;
  response->set_uptime_seconds(absl::ToDoubleSeconds(uptime));
  response->set_start_time_unix(absl::ToUnixSeconds(info_.start_time));
  response->set_listen_address(info_.listen_address);
  response->set_pid(info_.pid);
  return grpc::Status::OK;
}

}  // namespace hicache::service
