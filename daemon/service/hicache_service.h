#pragma once

#include <functional>
#include <optional>

#include "daemon/core/clock.h"
#include "daemon/core/daemon_info.h"
#include "daemon/engine/caller.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/request_flow.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/stream_context.h"
#include "daemon/events/kv_event_publisher.h"
#include "daemon/group/group_status.h"
#include "daemon/group/leader_view.h"
#include "daemon/service/caller_resolver.h"
#include "daemon/service/leader_guard.h"
#include "daemon/service/watch_broadcaster.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::service {

// Limits of the streaming RPCs.
struct StreamLimits {
  // Events waiting for a slow stream reader before the stream is cut off
  // (its backups rolled back, RESOURCE_EXHAUSTED).
  size_t max_backlog = 65536;
};

// What the service serves: the daemon's parts. All must outlive it.
struct ServiceParts {
  HiCacheEngine* engine = nullptr;
  SessionManager* sessions = nullptr;
  EventHub* hub = nullptr;
  WatchBroadcaster* watch = nullptr;
  // Who makes each call; nullptr: every caller is a plain client (no
  // operator RPCs).
  const CallerResolver* callers = nullptr;
  // This daemon's place in a CP group; nullptr: a standalone daemon, which
  // serves every RPC. On a follower the tree RPCs (rpc_scope.h) are refused
  // with a redirect to the leader (LeaderGuard).
  const LeaderView* group = nullptr;
  // A snapshot of this daemon's CP group for GetStats (cp_group, with the
  // leader's address from `group`). Empty function or nullopt: no group
  // (GetStats leaves cp_group unset). Called on RPC threads, concurrently;
  // must be thread-safe and must not block on an RPC.
  std::function<std::optional<group::GroupStatus>()> group_status;
  // KV events (docs/kv-events.md); nullptr: off (OpenSession's event
  // identity is validated and unused).
  events::KvEventPublisher* kv_events = nullptr;
};

// hicache.v1.HiCache. Thin by design: each handler validates fields,
// converts proto <-> domain types and absl::Status -> grpc::Status, and
// calls the engine layer, which does the work: SessionManager (sessions,
// confinement, ownership), RequestFlow (Admit / Complete) and the stream
// classes (BackupStream, LoadStream, WorkerSubscription: what a stream owns
// and what happens when its client goes away).
//
// Roles: Evict, SetFreeRoom, DumpTree, InspectNode, ListSessions and Watch
// act across tenants and need an operator caller (PERMISSION_DENIED
// otherwise); so does QueryTiers without a session. Session RPCs are
// confined by the session they name.
//
// CP groups: the RPCs that read or change the radix tree or the page
// metadata (rpc_scope.h, kTree and kByRole) check LeaderGuard first; on a
// follower they answer FAILED_PRECONDITION with the leader's address in the
// `hicache-leader` trailer and change nothing.
//
// Thread-safe: handlers share only thread-safe parts.
class HiCacheService final : public v1::HiCache::Service {
 public:
  // `info` is copied.
  HiCacheService(DaemonInfo info, const Clock* clock, ServiceParts parts,
                 StreamLimits limits = {});

  // The CacheEvent for an engine event (kind, op, node, rank, step).
  static v1::CacheEvent ToCacheEvent(const OpEvent& event);

  // Daemon and sessions (hicache_service.cc).
  grpc::Status GetStats(grpc::ServerContext* context,
                        const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;
  grpc::Status OpenSession(grpc::ServerContext* context,
                           const v1::OpenSessionRequest* request,
                           v1::OpenSessionResponse* response) override;
  grpc::Status KeepAlive(grpc::ServerContext* context,
                         const v1::KeepAliveRequest* request,
                         v1::KeepAliveResponse* response) override;
  grpc::Status CloseSession(grpc::ServerContext* context,
                            const v1::CloseSessionRequest* request,
                            v1::CloseSessionResponse* response) override;
  grpc::Status GetLayout(grpc::ServerContext* context,
                         const v1::GetLayoutRequest* request,
                         v1::GetLayoutResponse* response) override;
  grpc::Status RegisterFence(grpc::ServerContext* context,
                             const v1::RegisterFenceRequest* request,
                             v1::RegisterFenceResponse* response) override;
  grpc::Status ReleaseFence(grpc::ServerContext* context,
                            const v1::ReleaseFenceRequest* request,
                            v1::ReleaseFenceResponse* response) override;

  // Pages and the tree (hicache_service_cache.cc).
  grpc::Status Allocate(grpc::ServerContext* context,
                        const v1::AllocateRequest* request,
                        v1::AllocateResponse* response) override;
  grpc::Status Free(grpc::ServerContext* context,
                    const v1::FreeRequest* request,
                    v1::FreeResponse* response) override;
  grpc::Status MatchPrefix(grpc::ServerContext* context,
                           const v1::MatchPrefixRequest* request,
                           v1::MatchPrefixResponse* response) override;
  grpc::Status Insert(grpc::ServerContext* context,
                      const v1::InsertRequest* request,
                      v1::InsertResponse* response) override;
  grpc::Status Lock(grpc::ServerContext* context,
                    const v1::LockRequest* request,
                    v1::LockResponse* response) override;
  grpc::Status Unlock(grpc::ServerContext* context,
                      const v1::LockRequest* request,
                      v1::LockResponse* response) override;
  grpc::Status Admit(grpc::ServerContext* context,
                     const v1::AdmitRequest* request,
                     v1::AdmitResponse* response) override;
  grpc::Status Complete(grpc::ServerContext* context,
                        const v1::CompleteRequest* request,
                        v1::CompleteResponse* response) override;
  grpc::Status FinishLoad(grpc::ServerContext* context,
                          const v1::FinishLoadRequest* request,
                          v1::FinishLoadResponse* response) override;
  grpc::Status Pin(grpc::ServerContext* context, const v1::PinRequest* request,
                   v1::PinResponse* response) override;

  // Operators (hicache_service_operators.cc).
  grpc::Status Evict(grpc::ServerContext* context,
                     const v1::EvictRequest* request,
                     v1::EvictResponse* response) override;
  grpc::Status SetFreeRoom(grpc::ServerContext* context,
                           const v1::SetFreeRoomRequest* request,
                           v1::SetFreeRoomResponse* response) override;
  grpc::Status SetQuota(grpc::ServerContext* context,
                        const v1::SetQuotaRequest* request,
                        v1::SetQuotaResponse* response) override;
  grpc::Status ListQuotas(grpc::ServerContext* context,
                          const v1::ListQuotasRequest* request,
                          v1::ListQuotasResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context,
                     const v1::GetStatsRequest* request,
                     v1::CacheStats* response) override;
  grpc::Status DumpTree(grpc::ServerContext* context,
                        const v1::DumpTreeRequest* request,
                        v1::DumpTreeResponse* response) override;
  grpc::Status QueryTiers(grpc::ServerContext* context,
                          const v1::QueryTiersRequest* request,
                          v1::QueryTiersResponse* response) override;
  grpc::Status InspectNode(grpc::ServerContext* context,
                           const v1::InspectNodeRequest* request,
                           v1::NodeInfo* response) override;
  grpc::Status ListSessions(grpc::ServerContext* context,
                            const v1::ListSessionsRequest* request,
                            v1::ListSessionsResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::CacheEvent>* writer) override;

  // Streams (hicache_service_streams.cc).
  grpc::Status LoadBack(grpc::ServerContext* context,
                        const v1::LoadBackRequest* request,
                        grpc::ServerWriter<v1::LoadBackEvent>* writer) override;
  grpc::Status BackupSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::BackupServerMessage,
                               v1::BackupClientMessage>* stream) override;
  grpc::Status Subscribe(grpc::ServerContext* context,
                         const v1::SubscribeRequest* request,
                         grpc::ServerWriter<v1::WorkerEvent>* writer) override;

 private:
  Caller CallerOf(const grpc::ServerContext* context) const;
  // OK if the caller may use session `session_id`; NOT_FOUND, as for an
  // unknown session, if it belongs to another principal
  // (SessionManager::CheckCaller). First thing (after the leader guard) of
  // every call that names a session.
  grpc::Status CheckSessionCaller(const grpc::ServerContext* context,
                                  const std::string& session_id) const;
  // A stream's context: its mailbox's overflow cancels `context`'s RPC.
  StreamContext StreamContextFor(grpc::ServerContext* context) const;

  const DaemonInfo info_;
  const Clock* const clock_;
  HiCacheEngine* const engine_;
  SessionManager* const sessions_;
  EventHub* const hub_;
  WatchBroadcaster* const watch_;
  const CallerResolver* const callers_;
  const LeaderGuard guard_;
  const LeaderView* const group_;  // May be null (standalone).
  const std::function<std::optional<group::GroupStatus>()> group_status_;
  const StreamLimits limits_;
  events::KvEventPublisher* const kv_events_;  // May be null (off).
  RequestFlow flow_;
};

}  // namespace hicache::service
