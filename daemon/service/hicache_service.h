#pragma once

#include "daemon/core/clock.h"
#include "daemon/core/daemon_info.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::service {

// The HiCache gRPC service. Thin by design: it converts proto <-> domain types
// and absl::Status <-> grpc::Status, nothing else.
//
// Thread-safe: handlers only read immutable state.
class HiCacheServiceImpl final : public v1::HiCache::Service {
 public:
  // `info` is copied. `clock` must outlive the service.
  HiCacheServiceImpl(DaemonInfo info, const Clock* clock);

  grpc::Status GetStats(grpc::ServerContext* context,
                        const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;

 private:
  const DaemonInfo info_;
  const Clock* const clock_;
};

}  // namespace hicache::service
