#pragma once

// CpGroupRuntime: one daemon's part in a CP group of several daemons
// (docs/cp-groups.md), wired into hicached. It puts the group layer's
// pieces together with the process's gRPC, Gloo and engine:
//
//  * Leader (--cp_group without --cp_group_leader). Its engine serves every
//    rank of [0, C) (every rank's acks count) but holds pools only for its
//    own --ranks; a RoutingTransferEngine, installed through
//    EngineOptions::wrap_transfer, sends the other ranks' copies to their
//    members. A GroupLeader admits members; the internal CpGroup service
//    (Join, rendezvous) is registered on the daemon's gRPC server, and
//    each admitted member's Gloo link rendezvouses through the leader's own
//    store.
//  * Follower (--cp_group_leader=HOST:PORT). Its engine holds its ranks'
//    pools; its tree RPCs are redirected to the leader (LeaderView). Once
//    the server is up it joins the leader (retrying until
//    --cp_group_join_timeout_ms), connects its end of the link and runs a
//    GroupFollower, whose executor copies on this daemon's pools. Losing the
//    leader (or never reaching it) calls `on_fatal`: the daemon exits 1 and
//    its supervisor restarts it, so the group restarts as a unit.
//
// Lifecycle (DaemonServer): Create -> ConfigureEngine(options) ->
// HiCacheEngine::Create -> Attach(engine, backend, on_fatal) -> service()
// registered -> server built and started -> Start(server, tcp_port) ->
// ... -> Stop() before the engine goes. Thread-safe after Start.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/backend/backend.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/group/event_forwarder.h"
#include "daemon/group/group_follower.h"
#include "daemon/group/group_leader.h"
#include "daemon/group/group_status.h"
#include "daemon/group/leader_view.h"
#include "daemon/group/rendezvous_kv.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/main/leader_join_handler.h"
#include "daemon/service/caller_resolver.h"
#include "daemon/service/cp_group_service.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server.h"
#include "hicache/internal/v1/cp_group.grpc.pb.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace hicache {

class CpGroupRuntime final : public LeaderView {
 public:
  using FatalFn = std::function<void(const absl::Status& cause)>;

  // REQUIRES: config.cp_group.enabled() and `config` valid. `instance`:
  // the daemon's shared-memory instance (the default member name).
  // UNAVAILABLE when the Gloo device cannot bind --cp_group_bind.
  static absl::StatusOr<std::unique_ptr<CpGroupRuntime>> Create(
      const DaemonConfig& config, const std::string& instance);
  ~CpGroupRuntime() override;
  CpGroupRuntime(const CpGroupRuntime&) = delete;
  CpGroupRuntime& operator=(const CpGroupRuntime&) = delete;

  // Before the engine is created. Leader: served ranks all of [0, C), pool
  // ranks its own, the routing engine installed. Follower: unchanged.
  void ConfigureEngine(EngineOptions* options);

  // After the engine: the GroupLeader or the GroupFollower. `engine` and
  // `backend` must outlive Stop(). `members`: who may call the leader's
  // CpGroup service (operators only, see CpGroupService); nullptr lets any
  // caller (--insecure_tcp_for_testing). `on_fatal` is called at most once,
  // from a group thread, when a follower loses (or never reaches) its
  // leader.
  // `hub` and `sessions` (which must outlive Stop() too): the leader
  // forwards what its hub fans out to subscribers to the members holding
  // the ranks, and stores members' relayed worker acks through `sessions`;
  // a follower applies the leader's events to its hub, for its workers.
  absl::Status Attach(HiCacheEngine* engine, Backend* backend,
                      EventHub* hub, SessionManager* sessions,
                      const service::CallerResolver* members,
                      FatalFn on_fatal) ABSL_LOCKS_EXCLUDED(mu_);

  // Leader: the internal CpGroup service to register; nullptr on a
  // follower.
  grpc::Service* service() { return service_.get(); }

  // Once the server serves. Leader: its advertised address (the bound TCP
  // port when listen_tcp ended in :0).
  // Follower: starts joining.
  absl::Status Start(grpc::Server* server, int tcp_port)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For GetStats; never empty once attached.
  std::optional<group::GroupStatus> Status() const ABSL_LOCKS_EXCLUDED(mu_);

  // LeaderView.
  bool IsLeader() const override { return leader_role_; }
  std::string LeaderAddress() const override ABSL_LOCKS_EXCLUDED(mu_);
  // A follower's worker ack, relayed to the leader (UNAVAILABLE on a
  // leader or before the follower exists; fences never get here, the
  // service refuses them).
  absl::Status ForwardLayerStored(
      const std::string& ns, Rank rank, uint32_t step,
      absl::Span<const uint64_t> ops,
      absl::Span<const RankFence> fences) const override;

  // Says Bye, stops joining and the group's threads. Idempotent. Call
  // before the engine and the server are destroyed.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CpGroupRuntime(const DaemonConfig& config, std::string member);

  void JoinLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // One Join + connect + Run; OK once running.
  absl::Status JoinOnce() ABSL_LOCKS_EXCLUDED(mu_);
  void Fatal(const absl::Status& cause);
  // Erases the rendezvous keys of links done long enough ago that neither
  // end can still read them, and remembers `prefix` for later.
  void ReclaimLinkKeys(const std::string& prefix) ABSL_LOCKS_EXCLUDED(mu_);

  const DaemonConfig config_;
  const CpGroupConfig& group_ = config_.cp_group;
  const std::string member_;
  const bool leader_role_;
  std::shared_ptr<gloo::transport::Device> device_;

  // Leader.
  group::RoutingTransferEngine* routing_ = nullptr;  // Owned by the engine.
  // Before the GroupLeader: it outlives it. Shared with the hub's tap,
  // which may still run after this runtime is gone (the engine outlives
  // it); Stop() stops it, after which the tap's calls are dropped.
  std::shared_ptr<group::EventForwarder> forwarder_;
  std::unique_ptr<group::GroupLeader> leader_;
  std::unique_ptr<group::InMemoryRendezvousKv> kv_;
  std::unique_ptr<LeaderJoinHandler> joins_;
  std::unique_ptr<service::CpGroupService> service_;

  // What the engine was created with (ConfigureEngine).
  EngineOptions engine_options_;

  // Follower.
  std::unique_ptr<group::GroupFollower> follower_;
  std::string geometry_bytes_;  // EncodeGroupGeometry of this member.
  std::shared_ptr<internal::v1::CpGroup::Stub> leader_stub_;
  std::thread joiner_;

  FatalFn on_fatal_;

  mutable Mutex mu_;
  CondVar stop_cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // The Join RPC in flight (cancelled by Stop).
  grpc::ClientContext* join_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool fatal_ ABSL_GUARDED_BY(mu_) = false;
  std::string advertise_ ABSL_GUARDED_BY(mu_);
  // Leader: links whose leader end is done, oldest first, with when.
  std::deque<std::pair<std::string, absl::Time>> done_links_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
