#pragma once

#include "daemon/engine/caller.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/request_flow.h"
#include "daemon/engine/session_manager.h"
#include "daemon/service/watch_broadcaster.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::service {

// Limits of the streaming RPCs.
struct StreamLimits {
  // Events waiting for a slow stream reader before the stream is cut off
  // (its backups rolled back, RESOURCE_EXHAUSTED).
  size_t max_backlog = 65536;
};

// The cache RPCs of hicache.v1.HiCache (everything except GetStats, which
// HiCacheServiceImpl serves). Thin: validates fields, converts proto <->
// domain types and Status codes; sessions and the engine do the work.
//
// Roles: Evict, SetFreeRoom, DumpTree, InspectNode, ListSessions and Watch
// act across tenants and need an operator `caller` (PERMISSION_DENIED
// otherwise). Session RPCs are confined by the session they name.
//
// Thread-safe. The engine, sessions and hub must outlive the service.
class CacheRpcs {
 public:
  CacheRpcs(HiCacheEngine* engine, SessionManager* sessions, EventHub* hub,
            WatchBroadcaster* watch, StreamLimits limits = {});

  // The CacheEvent for an engine event (kind, op, node, rank, step).
  static v1::CacheEvent ToCacheEvent(const OpEvent& event);

  grpc::Status OpenSession(const Caller& caller,
                           const v1::OpenSessionRequest& request,
                           v1::OpenSessionResponse* response);
  grpc::Status KeepAlive(const v1::KeepAliveRequest& request,
                         v1::KeepAliveResponse* response);
  grpc::Status FinishLoad(const v1::FinishLoadRequest& request);
  grpc::Status RegisterFence(const v1::RegisterFenceRequest& request,
                             v1::RegisterFenceResponse* response);
  grpc::Status ReleaseFence(const v1::ReleaseFenceRequest& request,
                            v1::ReleaseFenceResponse* response);
  grpc::Status CloseSession(const v1::CloseSessionRequest& request,
                            v1::CloseSessionResponse* response);
  grpc::Status GetLayout(v1::GetLayoutResponse* response);
  grpc::Status Allocate(const v1::AllocateRequest& request,
                        v1::AllocateResponse* response);
  grpc::Status Free(const v1::FreeRequest& request);
  grpc::Status MatchPrefix(const v1::MatchPrefixRequest& request,
                           v1::MatchPrefixResponse* response);
  grpc::Status Insert(const v1::InsertRequest& request,
                      v1::InsertResponse* response);
  // One round trip before a request's forward and one after (RequestFlow).
  grpc::Status Admit(const v1::AdmitRequest& request,
                     v1::AdmitResponse* response);
  grpc::Status Complete(const v1::CompleteRequest& request,
                        v1::CompleteResponse* response);
  // Lock (`lock`) or Unlock; Lock answers the new locks' handles.
  grpc::Status Lock(const v1::LockRequest& request, bool lock,
                    v1::LockResponse* response);
  grpc::Status LoadBack(grpc::ServerContext* context,
                        const v1::LoadBackRequest& request,
                        grpc::ServerWriter<v1::LoadBackEvent>* writer);
  // A worker's own events (worker sessions only): its rank's layers and
  // every outcome of its namespace, until the client cancels.
  grpc::Status Subscribe(grpc::ServerContext* context,
                         const v1::SubscribeRequest& request,
                         grpc::ServerWriter<v1::WorkerEvent>* writer);
  grpc::Status BackupSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::BackupServerMessage,
                               v1::BackupClientMessage>* stream);
  grpc::Status Pin(const v1::PinRequest& request);
  grpc::Status Evict(const Caller& caller, const v1::EvictRequest& request,
                     v1::EvictResponse* response);
  grpc::Status SetFreeRoom(const Caller& caller,
                           const v1::SetFreeRoomRequest& request);
  grpc::Status Stats(v1::CacheStats* response);
  grpc::Status DumpTree(const Caller& caller,
                        const v1::DumpTreeRequest& request,
                        v1::DumpTreeResponse* response);
  grpc::Status InspectNode(const Caller& caller,
                           const v1::InspectNodeRequest& request,
                           v1::NodeInfo* response);
  grpc::Status ListSessions(const Caller& caller,
                            v1::ListSessionsResponse* response);
  grpc::Status Watch(const Caller& caller, grpc::ServerContext* context,
                     const v1::WatchRequest& request,
                     grpc::ServerWriter<v1::CacheEvent>* writer);

 private:
  HiCacheEngine* const engine_;
  SessionManager* const sessions_;
  EventHub* const hub_;
  WatchBroadcaster* const watch_;
  const StreamLimits limits_;
  RequestFlow flow_;
};

}  // namespace hicache::service
