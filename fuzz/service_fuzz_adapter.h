// The service adapter of //fuzz:service_fuzzer: how ops call the in-process
// gRPC service (service::HiCacheService) and what its stream handlers give
// the engine-layer stream classes.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <utility>

#include "daemon/engine/caller.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/stream_context.h"
#include "daemon/service/caller_resolver.h"
#include "daemon/service/hicache_service.h"
#include "grpcpp/server_context.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// The one place that knows how the service is called: each unary RPC with a
// fresh ServerContext, the caller's identity (daemon/engine/caller.h) coming
// from a resolver that Call() sets first. Session RPCs are made as a plain
// client, Evict / SetFreeRoom / DumpTree / InspectNode / ListSessions as an
// operator (or, to check the refusal, as a client). The streams get what
// HiCacheService::StreamContextFor gives them (Context()).

class Service {
 public:
  // Whoever Call() says the caller is.
  class Callers final : public service::CallerResolver {
   public:
    Caller Resolve(const grpc::ServerContext&) const override { return next; }
    Caller next;
  };

  Service(service::HiCacheService* rpcs, Callers* callers,
          SessionManager* sessions, HiCacheEngine* engine, EventHub* hub)
      : rpcs_(rpcs),
        callers_(callers),
        sessions_(sessions),
        engine_(engine),
        hub_(hub) {}

  static const Caller& Client() {
    static const Caller* const caller = new Caller{false, "fuzz client"};
    return *caller;
  }
  static const Caller& Operator() {
    static const Caller* const caller = new Caller{true, "fuzz operator"};
    return *caller;
  }

  // Unary RPCs.
  grpc::Status OpenSession(const v1::OpenSessionRequest& request,
                           v1::OpenSessionResponse* response) {
    return Call(Client(), &service::HiCacheService::OpenSession, &request,
                response);
  }
  grpc::Status KeepAlive(const v1::KeepAliveRequest& request) {
    v1::KeepAliveResponse response;
    return Call(Client(), &service::HiCacheService::KeepAlive, &request,
                &response);
  }
  grpc::Status CloseSession(const v1::CloseSessionRequest& request) {
    v1::CloseSessionResponse response;
    return Call(Client(), &service::HiCacheService::CloseSession, &request,
                &response);
  }
  grpc::Status GetLayout() {
    v1::GetLayoutResponse response;
    return Call(Client(), &service::HiCacheService::GetLayout,
                &v1::GetLayoutRequest::default_instance(), &response);
  }
  grpc::Status Allocate(const v1::AllocateRequest& request,
                        v1::AllocateResponse* response) {
    return Call(Client(), &service::HiCacheService::Allocate, &request,
                response);
  }
  grpc::Status Free(const v1::FreeRequest& request) {
    v1::FreeResponse response;
    return Call(Client(), &service::HiCacheService::Free, &request, &response);
  }
  grpc::Status MatchPrefix(const v1::MatchPrefixRequest& request,
                           v1::MatchPrefixResponse* response) {
    return Call(Client(), &service::HiCacheService::MatchPrefix, &request,
                response);
  }
  grpc::Status Insert(const v1::InsertRequest& request,
                      v1::InsertResponse* response) {
    return Call(Client(), &service::HiCacheService::Insert, &request, response);
  }
  // Lock, or Unlock (by nodes or by lock_handles).
  grpc::Status Lock(const v1::LockRequest& request, bool lock,
                    v1::LockResponse* response = nullptr) {
    v1::LockResponse scratch;
    return Call(Client(),
                lock ? &service::HiCacheService::Lock
                     : &service::HiCacheService::Unlock,
                &request, response != nullptr ? response : &scratch);
  }
  grpc::Status Admit(const v1::AdmitRequest& request,
                     v1::AdmitResponse* response) {
    return Call(Client(), &service::HiCacheService::Admit, &request, response);
  }
  grpc::Status Complete(const v1::CompleteRequest& request,
                        v1::CompleteResponse* response) {
    return Call(Client(), &service::HiCacheService::Complete, &request,
                response);
  }
  grpc::Status FinishLoad(const v1::FinishLoadRequest& request) {
    v1::FinishLoadResponse response;
    return Call(Client(), &service::HiCacheService::FinishLoad, &request,
                &response);
  }
  grpc::Status RegisterFence(const v1::RegisterFenceRequest& request,
                             v1::RegisterFenceResponse* response) {
    return Call(Client(), &service::HiCacheService::RegisterFence, &request,
                response);
  }
  grpc::Status ReleaseFence(const v1::ReleaseFenceRequest& request) {
    v1::ReleaseFenceResponse response;
    return Call(Client(), &service::HiCacheService::ReleaseFence, &request,
                &response);
  }
  grpc::Status Pin(const v1::PinRequest& request) {
    v1::PinResponse response;
    return Call(Client(), &service::HiCacheService::Pin, &request, &response);
  }
  grpc::Status Stats() {
    v1::CacheStats response;
    return Call(Client(), &service::HiCacheService::Stats,
                &v1::GetStatsRequest::default_instance(), &response);
  }
  // Operator RPCs; `as` is Operator() except to check the refusal.
  grpc::Status Evict(const Caller& as, const v1::EvictRequest& request) {
    v1::EvictResponse response;
    return Call(as, &service::HiCacheService::Evict, &request, &response);
  }
  grpc::Status SetFreeRoom(const Caller& as,
                           const v1::SetFreeRoomRequest& request) {
    v1::SetFreeRoomResponse response;
    return Call(as, &service::HiCacheService::SetFreeRoom, &request, &response);
  }
  grpc::Status SetQuota(const Caller& as, const v1::SetQuotaRequest& request) {
    v1::SetQuotaResponse response;
    return Call(as, &service::HiCacheService::SetQuota, &request, &response);
  }
  grpc::Status ListQuotas(const Caller& as, v1::ListQuotasResponse* response) {
    return Call(as, &service::HiCacheService::ListQuotas,
                &v1::ListQuotasRequest::default_instance(), response);
  }
  grpc::Status DumpTree(const Caller& as, const v1::DumpTreeRequest& request) {
    v1::DumpTreeResponse response;
    return Call(as, &service::HiCacheService::DumpTree, &request, &response);
  }
  grpc::Status InspectNode(const Caller& as,
                           const v1::InspectNodeRequest& request) {
    v1::NodeInfo response;
    return Call(as, &service::HiCacheService::InspectNode, &request, &response);
  }
  grpc::Status ListSessions(const Caller& as,
                            v1::ListSessionsResponse* response) {
    return Call(as, &service::HiCacheService::ListSessions,
                &v1::ListSessionsRequest::default_instance(), response);
  }

  // What HiCacheService::StreamContextFor gives a stream: a mailbox of
  // `backlog` events whose overflow cancels the RPC (here: sets *cancelled).
  StreamContext Context(size_t backlog,
                        std::shared_ptr<std::atomic<bool>> cancelled) const {
    return StreamContext{.sessions = sessions_,
                         .hub = hub_,
                         .engine = engine_,
                         .max_backlog = backlog,
                         .on_overflow = [cancelled = std::move(cancelled)] {
                           cancelled->store(true);
                         }};
  }

  // The lease reaper of DaemonServer.
  int ExpireLapsed() { return sessions_->ExpireLapsed(); }

 private:
  template <typename Request, typename Response>
  grpc::Status Call(const Caller& caller,
                    grpc::Status (service::HiCacheService::*method)(
                        grpc::ServerContext*, const Request*, Response*),
                    const Request* request, Response* response) {
    callers_->next = caller;
    grpc::ServerContext context;
    return (rpcs_->*method)(&context, request, response);
  }

  service::HiCacheService* const rpcs_;
  Callers* const callers_;
  SessionManager* const sessions_;
  HiCacheEngine* const engine_;
  EventHub* const hub_;
};

}  // namespace hicache::fuzz
