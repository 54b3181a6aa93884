#include "daemon/metrics/daemon_metrics.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/daemon_config.h"
#include "daemon/metrics/cache_collector.h"
#include "daemon/metrics/group_collector.h"
#include "daemon/metrics/kv_event_collector.h"
#include "daemon/metrics/layer_metrics.h"
#include "daemon/metrics/rpc_interceptor.h"
#include "daemon/metrics/rpc_metrics.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace hicache::metrics {

DaemonMetrics::DaemonMetrics()
    : registry_(std::make_shared<prometheus::Registry>()) {}

DaemonMetrics::~DaemonMetrics() { StopServing(); }

absl::StatusOr<std::unique_ptr<DaemonMetrics>> DaemonMetrics::Start(
    const std::string& address, const std::vector<std::string>& rpc_methods) {
  if (absl::Status valid = CheckMetricsAddress(address); !valid.ok()) {
    return valid;
  }
  std::unique_ptr<DaemonMetrics> metrics(new DaemonMetrics());
  metrics->rpc_ = std::make_unique<RpcMetrics>(*metrics->registry_, rpc_methods);
  metrics->layers_ = std::make_unique<LayerMetrics>(*metrics->registry_);
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed bind by throwing; nothing leaves here.
  try {
    exposer = std::make_unique<prometheus::Exposer>(
        // Two threads; a client that connects and says nothing holds one
        // for at most the request timeout.
        std::vector<std::string>{"listening_ports", address, "num_threads",
                                 "2", "request_timeout_ms", "5000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", address,
        " (metrics_address): in use, or not an address of this host? (",
        e.what(), ")"));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, " (metrics_address)"));
  }
  metrics->port_ = ports.front();
  exposer->RegisterCollectable(metrics->registry_);
  MutexLock lock(&metrics->mu_);
  metrics->exposer_ = std::move(exposer);
  return metrics;
}

EngineObserver* DaemonMetrics::engine_observer() { return layers_.get(); }

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
DaemonMetrics::MakeInterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(rpc_.get());
}

void DaemonMetrics::Watch(const HiCacheEngine* engine,
                          const SessionManager* sessions) {
  MutexLock lock(&mu_);
  collector_ = std::make_shared<CacheCollector>(engine, sessions);
  if (exposer_ != nullptr) exposer_->RegisterCollectable(collector_);
}

void DaemonMetrics::WatchGroup(
    std::function<std::optional<group::GroupStatus>()> status) {
  MutexLock lock(&mu_);
  group_collector_ = std::make_shared<GroupCollector>(std::move(status));
  if (exposer_ != nullptr) exposer_->RegisterCollectable(group_collector_);
}

void DaemonMetrics::WatchKvEvents(
    std::function<events::KvEventPublisherStats()> stats) {
  MutexLock lock(&mu_);
  kv_event_collector_ = std::make_shared<KvEventCollector>(std::move(stats));
  if (exposer_ != nullptr) exposer_->RegisterCollectable(kv_event_collector_);
}

void DaemonMetrics::StopServing() {
  std::unique_ptr<prometheus::Exposer> exposer;
  {
    MutexLock lock(&mu_);
    exposer = std::move(exposer_);
  }
  // Joins civetweb's threads: no Collect() runs after this.
  exposer.reset();
}

}  // namespace hicache::metrics
