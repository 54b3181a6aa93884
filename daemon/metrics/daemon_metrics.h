#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/engine_observer.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/events/kv_event_publisher.h"
#include "daemon/engine/session_manager.h"
#include "daemon/group/group_status.h"
#include "grpcpp/support/server_interceptor.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace hicache::metrics {

class CacheCollector;
class GroupCollector;
class KvEventCollector;
class LayerMetrics;
class RpcMetrics;

// The daemon's Prometheus endpoint: GET /metrics over plain HTTP (prometheus-
// cpp's Exposer on civetweb) with the RPC series (an interceptor), the
// per-layer timings (an EngineObserver) and the cache's state (a collector
// over the engine and the sessions, read at scrape time). docs/metrics.md.
//
// Lifetime: Start() (binds at once, before the engine exists) ->
// engine_observer() into the engine's options, interceptor factory into the
// gRPC server -> Watch(engine, sessions) -> ... -> StopServing() before the
// engine and the sessions go -> destructor after the gRPC server and the
// engine (the interceptors and the observer point into this object).
class DaemonMetrics {
 public:
  // Listens on `address` (CheckMetricsAddress form; port 0 picks a free
  // one). `rpc_methods`: every "/package.Service/Method" path the server
  // serves (others are counted as "unknown"). INVALID_ARGUMENT for a bad
  // address; UNAVAILABLE naming the address when it cannot listen there (in
  // use, no permission).
  static absl::StatusOr<std::unique_ptr<DaemonMetrics>> Start(
      const std::string& address, const std::vector<std::string>& rpc_methods);
  ~DaemonMetrics();

  // The bound port (the chosen one for port 0).
  int port() const { return port_; }
  EngineObserver* engine_observer();
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  MakeInterceptorFactory();
  // Adds the cache collector; both must outlive StopServing().
  void Watch(const HiCacheEngine* engine, const SessionManager* sessions)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the CP group's series (GroupCollector over `status`, called at
  // scrape time); `status` must stay callable until StopServing().
  void WatchGroup(
      std::function<std::optional<group::GroupStatus>()> status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the KV-event publisher's series (KvEventCollector over `stats`);
  // `stats` must stay callable until StopServing().
  void WatchKvEvents(std::function<events::KvEventPublisherStats()> stats)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the HTTP server (waits for scrapes in progress). Idempotent.
  void StopServing() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  DaemonMetrics();

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RpcMetrics> rpc_;
  std::unique_ptr<LayerMetrics> layers_;
  int port_ = 0;
  Mutex mu_;
  std::shared_ptr<CacheCollector> collector_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<GroupCollector> group_collector_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<KvEventCollector> kv_event_collector_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<prometheus::Exposer> exposer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::metrics
