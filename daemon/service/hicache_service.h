#pragma once

#include "daemon/core/clock.h"
#include "daemon/core/daemon_info.h"
#include "daemon/service/cache_service.h"
#include "daemon/service/caller_resolver.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::service {

// The HiCache gRPC service. Thin by design: it converts proto <-> domain types
// and absl::Status <-> grpc::Status, nothing else.
//
// Thread-safe: handlers only read immutable state.
class HiCacheServiceImpl final : public v1::HiCache::Service {
 public:
  // `info` is copied. `clock`, `cache` and `callers` must outlive the
  // service; without `cache` every cache RPC answers FAILED_PRECONDITION.
  // Without `callers` every caller is a plain client (no operator RPCs).
  HiCacheServiceImpl(DaemonInfo info, const Clock* clock,
                     CacheRpcs* cache = nullptr,
                     const CallerResolver* callers = nullptr);

  grpc::Status GetStats(grpc::ServerContext* context,
                        const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;

#define HICACHE_UNARY(Name, Request, Response)                            \
  grpc::Status Name(grpc::ServerContext* context, const Request* request, \
                    Response* response) override;
  HICACHE_UNARY(OpenSession, v1::OpenSessionRequest, v1::OpenSessionResponse)
  HICACHE_UNARY(KeepAlive, v1::KeepAliveRequest, v1::KeepAliveResponse)
  HICACHE_UNARY(FinishLoad, v1::FinishLoadRequest, v1::FinishLoadResponse)
  HICACHE_UNARY(RegisterFence, v1::RegisterFenceRequest,
                v1::RegisterFenceResponse)
  HICACHE_UNARY(ReleaseFence, v1::ReleaseFenceRequest,
                v1::ReleaseFenceResponse)
  HICACHE_UNARY(CloseSession, v1::CloseSessionRequest, v1::CloseSessionResponse)
  HICACHE_UNARY(GetLayout, v1::GetLayoutRequest, v1::GetLayoutResponse)
  HICACHE_UNARY(Allocate, v1::AllocateRequest, v1::AllocateResponse)
  HICACHE_UNARY(Free, v1::FreeRequest, v1::FreeResponse)
  HICACHE_UNARY(MatchPrefix, v1::MatchPrefixRequest, v1::MatchPrefixResponse)
  HICACHE_UNARY(Insert, v1::InsertRequest, v1::InsertResponse)
  HICACHE_UNARY(Lock, v1::LockRequest, v1::LockResponse)
  HICACHE_UNARY(Unlock, v1::LockRequest, v1::LockResponse)
  HICACHE_UNARY(Admit, v1::AdmitRequest, v1::AdmitResponse)
  HICACHE_UNARY(Complete, v1::CompleteRequest, v1::CompleteResponse)
  HICACHE_UNARY(Pin, v1::PinRequest, v1::PinResponse)
  HICACHE_UNARY(Evict, v1::EvictRequest, v1::EvictResponse)
  HICACHE_UNARY(SetFreeRoom, v1::SetFreeRoomRequest, v1::SetFreeRoomResponse)
  HICACHE_UNARY(Stats, v1::GetStatsRequest, v1::CacheStats)
  HICACHE_UNARY(DumpTree, v1::DumpTreeRequest, v1::DumpTreeResponse)
  HICACHE_UNARY(InspectNode, v1::InspectNodeRequest, v1::NodeInfo)
  HICACHE_UNARY(ListSessions, v1::ListSessionsRequest, v1::ListSessionsResponse)
#undef HICACHE_UNARY

  grpc::Status LoadBack(grpc::ServerContext* context,
                        const v1::LoadBackRequest* request,
                        grpc::ServerWriter<v1::LoadBackEvent>* writer) override;
  grpc::Status BackupSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::BackupServerMessage,
                               v1::BackupClientMessage>* stream) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::CacheEvent>* writer) override;
  grpc::Status Subscribe(grpc::ServerContext* context,
                         const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::WorkerEvent>* writer) override;

 private:
  const DaemonInfo info_;
  const Clock* const clock_;
  Caller CallerOf(const grpc::ServerContext* context) const;

  CacheRpcs* const cache_;
  const CallerResolver* const callers_;
};

}  // namespace hicache::service
