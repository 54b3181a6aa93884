#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/backend/backend.h"
#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/mutex.h"
#include "daemon/events/kv_event_publisher.h"
#include "daemon/group/group_status.h"
#include "daemon/group/leader_view.h"
#include "daemon/main/call_counter.h"
#include "daemon/main/socket_guard.h"
#include "daemon/storage/page_store.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"

namespace hicache {

class ConnectionRegistry;
class CpGroupRuntime;
class EventHub;
class HiCacheEngine;
class SocketListener;
class SessionManager;
class ShmInstance;
namespace metrics {
class DaemonMetrics;
}  // namespace metrics
namespace service {
class WatchBroadcaster;
class HiCacheService;
}  // namespace service

// A running hicached: the gRPC server on its unix socket with the HiCache
// service, gRPC health checking and server reflection.
//
// Lifetime: Start() -> (any thread) Shutdown() -> Wait() -> destructor. The
// destructor shuts down if needed and removes the socket.
// Thread-safe: Shutdown() may be called from any thread, any number of times.
class DaemonServer {
 public:
  // Health-check service name of the HiCache API.
  static constexpr char kHealthServiceName[] = "hicache.v1.HiCache";

  // Sizes the host tier (ResolveHostPages: a host_bytes_per_rank budget
  // becomes host_pages_per_rank, which GetStats then reports) and validates
  // `config`, builds the engine from it (EngineOptionsFrom), takes
  // ownership of `socket_path` (see SocketGuard),
  // then of the shared-memory instance config.instance (default:
  // DefaultInstanceId() of the canonical socket path; see ShmInstance, which
  // reclaims the segments a dead daemon of that instance left), and starts
  // serving on the socket with mode 0660. `clock` must outlive the server.
  // config.cp_group, when enabled, makes this daemon a CP group's leader or
  // follower (CpGroupRuntime; a follower that loses its leader stops as
  // after a listener failure, see failure()). `leader_view` and
  // `group_status` stand in for a group in tests
  // (--cp_group_test_non_leader_of): this daemon's place in a CP group
  // (ServiceParts::group) and its snapshot for GetStats; not with
  // config.cp_group.
  static absl::StatusOr<std::unique_ptr<DaemonServer>> Start(
      const DaemonConfig& config, const std::string& socket_path,
      const Clock* clock, std::unique_ptr<LeaderView> leader_view = nullptr,
      std::function<std::optional<group::GroupStatus>()> group_status =
          nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  ~DaemonServer() ABSL_LOCKS_EXCLUDED(mu_);

  // Reports NOT_SERVING, stops accepting RPCs and cancels those still running
  // after `grace`. Idempotent.
  void Shutdown(absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the server has shut down.
  void Wait();

  // OK, or why the daemon stopped by itself: the unix-socket listener broke
  // (it can take no new connection), or a CP group follower lost its leader,
  // so it shut down as after Shutdown(), and hicached exits 1 for its
  // supervisor to restart it.
  absl::Status failure() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& listen_address() const { return listen_address_; }
  const SocketGuard& socket() const { return *socket_; }
  const ShmInstance& shm_instance() const { return *shm_; }
  HiCacheEngine& engine() const { return *engine_; }
  // The bound TCP port when listen_tcp was given (":0" picks one), else 0.
  int tcp_port() const { return tcp_port_; }
  SessionManager& sessions() const { return *sessions_; }
  // The bound port of the Prometheus endpoint (config.metrics_address;
  // port 0 picks one), or 0 when metrics are off.
  int metrics_port() const;

 private:
  DaemonServer() = default;
  static absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
  TcpCredentials(const DaemonConfig& config);
  // Expires lapsed leases until shutdown; with `paranoid_checks`, checks
  // the engine's invariants after each expiry and logs the outcome.
  void ReapLeases(bool paranoid_checks) ABSL_LOCKS_EXCLUDED(mu_);
  // The listener failed for good (on its accept thread): records `status`
  // and shuts down from another thread, as Shutdown() joins the listener.
  void Fail(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<SocketGuard> socket_;
  // Declared before the engine: its lock outlives the pools' segments.
  std::unique_ptr<ShmInstance> shm_;
  std::string listen_address_;
  // Before the engine and the gRPC server: the engine's observer and the
  // RPC interceptors point into it. Its HTTP server is stopped first of all
  // (~DaemonServer), while everything its collector reads still exists.
  std::unique_ptr<metrics::DaemonMetrics> metrics_;
  int tcp_port_ = 0;
  std::unique_ptr<service::WatchBroadcaster> watch_;
  std::unique_ptr<EventHub> hub_;
  std::unique_ptr<Backend> backend_;  // Outlives the engine (its pools).
  // The storage tier's stores (outlive the engine, which writes to them).
  std::vector<std::unique_ptr<PageStore>> stores_;
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  // config.kv_events: after the engine (destroyed before it, once the
  // engine no longer calls it: ~DaemonServer detaches it first).
  std::unique_ptr<events::KvEventPublisher> kv_events_;
  std::unique_ptr<ConnectionRegistry> connections_;
  // Calls in progress: shutdown closes the connections once none is left
  // (idle ones would otherwise hold gRPC's shutdown for the whole grace).
  std::shared_ptr<CallCounter> calls_ = CallCounter::Create();
  std::unique_ptr<LeaderView> leader_view_;  // Read by service_.
  // config.cp_group: this daemon's part in a CP group (the service's
  // LeaderView when set). After the engine (stopped and destroyed before
  // it), before the server (which serves its CpGroup service).
  std::unique_ptr<CpGroupRuntime> group_;
  std::unique_ptr<service::HiCacheService> service_;
  std::thread reaper_;
  CondVar reaper_cv_;
  // Set once in Start(); Shutdown()/Wait() are thread-safe gRPC calls.
  std::unique_ptr<grpc::Server> server_;
  // Declared after server_: destroyed (stopped) before it.
  std::unique_ptr<SocketListener> listener_;
  // --listen_tcp: accepted by tcp_listener_ (the connection cap and
  // descriptor exhaustion handled as on the unix socket), counted in
  // tcp_connections_ (no credentials: a TCP peer is named by TLS), and
  // handed to gRPC through tcp_acceptor_ with the TCP credentials. The
  // acceptor after server_, the listener after it: stopped first.
  std::unique_ptr<ConnectionRegistry> tcp_connections_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor>
      tcp_acceptor_;
  std::unique_ptr<SocketListener> tcp_listener_;

  mutable Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Runs Shutdown() after a listener failure; joined by the destructor.
  std::thread failer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
