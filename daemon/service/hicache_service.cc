#include "daemon/service/hicache_service.h"

#include <utility>

#include "absl/time/time.h"
#include "daemon/service/proto_convert.h"

namespace hicache::service {

HiCacheServiceImpl::HiCacheServiceImpl(DaemonInfo info, const Clock* clock,
                                       CacheRpcs* cache,
                                       const CallerResolver* callers)
    : info_(std::move(info)), clock_(clock), cache_(cache), callers_(callers) {}

Caller HiCacheServiceImpl::CallerOf(const grpc::ServerContext* context) const {
  if (callers_ == nullptr) return Caller::Client("unidentified client");
  return callers_->Resolve(*context);
}

namespace {
grpc::Status NoCache() {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      "this server has no cache engine");
}
}  // namespace

#define HICACHE_FORWARD(Name, Request, Response, Call)                    \
  grpc::Status HiCacheServiceImpl::Name(                                  \
      grpc::ServerContext* context, const Request* request,               \
      Response* response) {                                               \
    (void)context;                                                        \
    if (cache_ == nullptr) return NoCache();                              \
    return Call;                                                          \
  }
HICACHE_FORWARD(OpenSession, v1::OpenSessionRequest, v1::OpenSessionResponse,
                cache_->OpenSession(CallerOf(context), *request, response))
HICACHE_FORWARD(KeepAlive, v1::KeepAliveRequest, v1::KeepAliveResponse,
                cache_->KeepAlive(*request, response))
HICACHE_FORWARD(FinishLoad, v1::FinishLoadRequest, v1::FinishLoadResponse,
                cache_->FinishLoad(*request))
HICACHE_FORWARD(RegisterFence, v1::RegisterFenceRequest,
                v1::RegisterFenceResponse,
                cache_->RegisterFence(*request, response))
HICACHE_FORWARD(ReleaseFence, v1::ReleaseFenceRequest,
                v1::ReleaseFenceResponse,
                cache_->ReleaseFence(*request, response))
HICACHE_FORWARD(CloseSession, v1::CloseSessionRequest, v1::CloseSessionResponse,
                cache_->CloseSession(*request, response))
HICACHE_FORWARD(GetLayout, v1::GetLayoutRequest, v1::GetLayoutResponse,
                cache_->GetLayout(response))
HICACHE_FORWARD(Allocate, v1::AllocateRequest, v1::AllocateResponse,
                cache_->Allocate(*request, response))
HICACHE_FORWARD(Free, v1::FreeRequest, v1::FreeResponse, cache_->Free(*request))
HICACHE_FORWARD(MatchPrefix, v1::MatchPrefixRequest, v1::MatchPrefixResponse,
                cache_->MatchPrefix(*request, response))
HICACHE_FORWARD(Insert, v1::InsertRequest, v1::InsertResponse,
                cache_->Insert(*request, response))
HICACHE_FORWARD(Lock, v1::LockRequest, v1::LockResponse,
                cache_->Lock(*request, true, response))
HICACHE_FORWARD(Unlock, v1::LockRequest, v1::LockResponse,
                cache_->Lock(*request, false, response))
HICACHE_FORWARD(Admit, v1::AdmitRequest, v1::AdmitResponse,
                cache_->Admit(*request, response))
HICACHE_FORWARD(Complete, v1::CompleteRequest, v1::CompleteResponse,
                cache_->Complete(*request, response))
HICACHE_FORWARD(Pin, v1::PinRequest, v1::PinResponse, cache_->Pin(*request))
HICACHE_FORWARD(Evict, v1::EvictRequest, v1::EvictResponse,
                cache_->Evict(CallerOf(context), *request, response))
HICACHE_FORWARD(SetFreeRoom, v1::SetFreeRoomRequest, v1::SetFreeRoomResponse,
                cache_->SetFreeRoom(CallerOf(context), *request))
HICACHE_FORWARD(Stats, v1::GetStatsRequest, v1::CacheStats,
                cache_->Stats(response))
HICACHE_FORWARD(DumpTree, v1::DumpTreeRequest, v1::DumpTreeResponse,
                cache_->DumpTree(CallerOf(context), *request, response))
HICACHE_FORWARD(InspectNode, v1::InspectNodeRequest, v1::NodeInfo,
                cache_->InspectNode(CallerOf(context), *request, response))
HICACHE_FORWARD(ListSessions, v1::ListSessionsRequest, v1::ListSessionsResponse,
                cache_->ListSessions(CallerOf(context), response))
#undef HICACHE_FORWARD

grpc::Status HiCacheServiceImpl::LoadBack(
    grpc::ServerContext* context, const v1::LoadBackRequest* request,
    grpc::ServerWriter<v1::LoadBackEvent>* writer) {
  if (cache_ == nullptr) return NoCache();
  return cache_->LoadBack(context, *request, writer);
}

grpc::Status HiCacheServiceImpl::Watch(
    grpc::ServerContext* context, const v1::WatchRequest* request,
    grpc::ServerWriter<v1::CacheEvent>* writer) {
  if (cache_ == nullptr) return NoCache();
  return cache_->Watch(CallerOf(context), context, *request, writer);
}

grpc::Status HiCacheServiceImpl::Subscribe(
    grpc::ServerContext* context, const v1::SubscribeRequest* request,
    grpc::ServerWriter<v1::WorkerEvent>* writer) {
  if (cache_ == nullptr) return NoCache();
  return cache_->Subscribe(context, *request, writer);
}

grpc::Status HiCacheServiceImpl::BackupSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::BackupServerMessage, v1::BackupClientMessage>*
        stream) {
  if (cache_ == nullptr) return NoCache();
  return cache_->BackupSession(context, stream);
}

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
  const DaemonConfig& c = info_.config;
  v1::EngineSettings* settings = response->mutable_settings();
  settings->set_write_policy(c.write_policy);
  settings->set_eviction_policy(c.eviction_policy);
  settings->set_write_through_threshold(c.write_through_threshold);
  settings->set_load_back_threshold_tokens(c.load_back_threshold_tokens);
  settings->set_l1_free_room_pages(c.l1_free_room_pages);
  settings->set_l2_free_room_pages(c.l2_free_room_pages);
  settings->set_transfer_workers(c.transfer_workers);
  settings->set_lock_host_memory(c.lock_host_memory);
  settings->set_pin_host_memory(c.pin_host_memory);
  settings->set_copy_max_blocks(c.copy_max_blocks);
  settings->mutable_gpus()->Add(c.gpus.begin(), c.gpus.end());
  settings->set_cuda_runtime(c.cuda_runtime);
  return grpc::Status::OK;
}

}  // namespace hicache::service
