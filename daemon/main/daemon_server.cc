#include "daemon/main/daemon_server.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/build_info.h"
#include "daemon/core/daemon_info.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/engine_options.h"
#include "daemon/main/storage_stores.h"
#include "daemon/events/kv_event_options.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/main/backend_factory.h"
#include "daemon/main/connection_registry.h"
#include "daemon/main/cp_group_runtime.h"
#include "daemon/main/grpc_support.h"
#include "daemon/main/socket_listener.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/pool/host_budget.h"
#include "daemon/pool/persistent_host_segment.h"
#include "daemon/pool/shm_instance.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/watch_broadcaster.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace hicache {

namespace {

// `socket_path` with its directory resolved (absolute, no symlinks), so that
// every spelling of one socket gives the same default instance id.
std::string CanonicalSocketPath(const std::string& socket_path) {
  const size_t slash = socket_path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : socket_path.substr(0, slash + 1);
  const std::string name =
      slash == std::string::npos ? socket_path : socket_path.substr(slash + 1);
  char* real = realpath(dir.c_str(), nullptr);
  if (real == nullptr) return socket_path;
  std::string canonical = real;
  free(real);
  if (canonical != "/") canonical += "/";
  return canonical + name;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>>
DaemonServer::TcpCredentials(const DaemonConfig& config) {
  if (config.tls_cert_file.empty()) {
    spdlog::warn("listening on {} WITHOUT TLS (--insecure_tcp_for_testing)",
                 config.listen_tcp);
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadCredentialsFile(config.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadCredentialsFile(config.tls_key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!config.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadCredentialsFile(config.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

namespace {

std::string Gib(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
}

// The backend, once at start (each pool logged its size, device and pin
// time as it was created).
void LogPools(const HiCacheEngine& engine) {
  uint64_t device = 0, host = 0;
  for (Rank rank : engine.pools().layout().served_ranks()) {
    const KvPool* device_pool = engine.pools().device(rank);
    const KvPool* host_pool = engine.pools().host(rank);
    device += device_pool->size_bytes();
    if (host_pool != nullptr) host += host_pool->size_bytes();
    // The CUDA backend logs its pools as it makes them; the CPU backend's
    // shared-memory pools are reported here.
    if (device_pool->Export().kind != PoolExport::Kind::kSharedMemory ||
        host_pool == nullptr) {
      continue;
    }
    spdlog::info(
        "rank {}: device pool {} ({} bytes) and host pool {} ({} bytes, {}) "
        "in shared memory",
        rank, Gib(device_pool->size_bytes()), device_pool->size_bytes(),
        Gib(host_pool->size_bytes()), host_pool->size_bytes(),
        host_pool->pinned()
            ? absl::StrCat("locked in ",
                           absl::FormatDuration(host_pool->pin_time()))
            : std::string("not locked"));
  }
  spdlog::info("backend {}: {} device and {} host pool bytes over {} ranks",
               engine.backend_name(), Gib(device), Gib(host),
               engine.pools().layout().served_ranks().size());
}

// Every method path the server serves, for the RPC metrics' labels.
std::vector<std::string> ServedMethods() {
  std::vector<std::string> methods = {
      "/grpc.health.v1.Health/Check",
      "/grpc.health.v1.Health/Watch",
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
  };
  for (const char* name : {"hicache.v1.HiCache", "hicache.internal.v1.CpGroup"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            name);
    for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
      methods.push_back(absl::StrCat("/", service->full_name(), "/",
                                     service->method(i)->name()));
    }
  }
  return methods;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonServer>> DaemonServer::Start(
    const DaemonConfig& given, const std::string& socket_path,
    const Clock* clock, std::unique_ptr<LeaderView> leader_view,
    std::function<std::optional<group::GroupStatus>()> group_status) {
  // The host tier's pages, from the byte budget when one is given: what the
  // engine gets and what GetStats reports.
  DaemonConfig config = given;
  absl::StatusOr<HostBudget> host_budget = ResolveHostPages(&config);
  if (!host_budget.ok()) return host_budget.status();
  if (absl::Status valid = config.Validate(); !valid.ok()) return valid;

  absl::StatusOr<std::unique_ptr<SocketGuard>> socket =
      SocketGuard::Acquire(socket_path);
  if (!socket.ok()) return socket.status();

  const std::string address = absl::StrCat("unix:", socket_path);
  std::unique_ptr<DaemonServer> daemon(new DaemonServer());
  daemon->socket_ = *std::move(socket);

  const std::string instance =
      config.instance.empty()
          ? DefaultInstanceId(CanonicalSocketPath(socket_path))
          : config.instance;
  absl::StatusOr<std::unique_ptr<ShmInstance>> shm =
      ShmInstance::Acquire(instance);
  if (!shm.ok()) return shm.status();
  daemon->shm_ = *std::move(shm);
  if (config.state_dir.empty()) {
    // Host pools a hot-restart daemon of this instance kept can never be
    // used without --state_dir: give their memory back.
    for (const std::string& name :
         RemovePersistentHostSegments(daemon->shm_->prefix())) {
      spdlog::warn("removed host pool {} kept for a hot restart (--state_dir "
                   "is not set)",
                   name);
    }
  }
  const ShmInstance::Reclaimed& reclaimed = daemon->shm_->reclaimed();
  spdlog::info("shared-memory instance '{}': segments {}-*, lock {}", instance,
               daemon->shm_->prefix(), daemon->shm_->lock_path());
  if (reclaimed.segments > 0) {
    spdlog::warn(
        "reclaimed {} stale shared-memory segments of instance '{}' left by a "
        "dead daemon: {} bytes ({} bytes resident)",
        reclaimed.segments, instance, reclaimed.bytes,
        reclaimed.resident_bytes);
  }
  for (const std::string& skipped : reclaimed.skipped) {
    spdlog::warn("left a shared-memory entry of instance '{}' in place: {}",
                 instance, skipped);
  }
  daemon->listen_address_ = address;
  if (!config.metrics_address.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::DaemonMetrics>> served =
        metrics::DaemonMetrics::Start(config.metrics_address, ServedMethods());
    if (!served.ok()) return served.status();
    daemon->metrics_ = *std::move(served);
    spdlog::info("Prometheus metrics on http://{}:{}/metrics",
                 config.metrics_address.substr(
                     0, config.metrics_address.rfind(':')),
                 daemon->metrics_->port());
  }
  daemon->watch_ = std::make_unique<service::WatchBroadcaster>();
  daemon->hub_ = std::make_unique<EventHub>();
  service::WatchBroadcaster* watch = daemon->watch_.get();
  daemon->hub_->SetObserver([watch](const OpEvent& event) {
    watch->Publish(service::HiCacheService::ToCacheEvent(event));
  });
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(config, daemon->shm_->prefix());
  if (!backend.ok()) return backend.status();
  daemon->backend_ = *std::move(backend);
  if (config.cp_group.enabled()) {
    if (leader_view != nullptr) {
      return absl::InvalidArgumentError(
          "cp_group and a test leader view cannot be combined");
    }
    absl::StatusOr<std::unique_ptr<CpGroupRuntime>> group =
        CpGroupRuntime::Create(config, instance);
    if (!group.ok()) return group.status();
    daemon->group_ = *std::move(group);
  }
  if (!config.kv_events.endpoint.empty()) {
    absl::StatusOr<std::unique_ptr<events::KvEventPublisher>> publisher =
        events::KvEventPublisher::Create(
            events::KvEventPublisherOptionsFrom(config));
    if (!publisher.ok()) return publisher.status();
    daemon->kv_events_ = *std::move(publisher);
    spdlog::info("KV events on {} (replay: {}), blocks of {} tokens",
                 daemon->kv_events_->endpoint(),
                 daemon->kv_events_->replay_endpoint().empty()
                     ? std::string("off")
                     : daemon->kv_events_->replay_endpoint(),
                 daemon->kv_events_->format().block_size);
  }
  EngineOptions engine_options = EngineOptionsFrom(config);
  if (daemon->kv_events_ != nullptr) {
    engine_options.tier_listener = daemon->kv_events_.get();
    engine_options.tier_block_size = config.kv_events.block_size;
    engine_options.tier_hash_seed = config.kv_events.hash_seed;
  }
  if (daemon->group_ != nullptr) {
    daemon->group_->ConfigureEngine(&engine_options);
  }
  {
    absl::StatusOr<KvGeometry> geometry = KvGeometry::Resolve(
        engine_options.kv_preset, engine_options.kv_families,
        engine_options.page_size);
    if (!geometry.ok()) return geometry.status();
    absl::StatusOr<std::vector<std::unique_ptr<PageStore>>> stores =
        OpenStorageStores(config, *geometry);
    if (!stores.ok()) return stores.status();
    daemon->stores_ = *std::move(stores);
    for (uint32_t r = 0; r < config.cp_size && !daemon->stores_.empty();
         ++r) {
      // One store per rank, or one shared by every rank.
      engine_options.storage.push_back(
          daemon->stores_[daemon->stores_.size() == 1 ? 0 : r].get());
    }
  }
  engine_options.clock = clock;
  engine_options.backend = daemon->backend_.get();
  engine_options.shm_prefix = daemon->shm_->prefix();
  if (daemon->metrics_ != nullptr) {
    engine_options.observer = daemon->metrics_->engine_observer();
  }
  absl::StatusOr<std::unique_ptr<HiCacheEngine>> engine =
      HiCacheEngine::Create(engine_options);
  if (!engine.ok()) return engine.status();
  daemon->engine_ = *std::move(engine);
  if (daemon->kv_events_ != nullptr) {
    HiCacheEngine* const e = daemon->engine_.get();
    daemon->kv_events_->SetEngineHooks(
        [e](absl::string_view ns, absl::FunctionRef<void()> between) {
          e->ReannounceNamespace(ns, between);
        },
        [e] { e->ResyncTierEvents(); });
  }
  LogPools(*daemon->engine_);
  spdlog::info("{}", DescribeHostBudget(*host_budget));
  daemon->engine_->SetListener(daemon->hub_.get());
  daemon->sessions_ = std::make_unique<SessionManager>(
      daemon->engine_.get(), clock,
      absl::Milliseconds(config.default_lease_ms),
      SessionLimits{
          .max_sessions = config.max_sessions,
          .max_namespaces = config.max_namespaces,
          .max_items_per_request = config.max_items_per_request,
          .max_pages_per_request = config.max_pages_per_request,
          .max_tokens_per_request = config.max_tokens_per_request,
          .max_pin_ttl = absl::Milliseconds(config.max_pin_ttl_ms),
          .max_streams_per_session = config.max_streams_per_session,
      });
  daemon->sessions_->SetObserver(
      [watch](absl::string_view kind, const std::string& session) {
        v1::CacheEvent event;
        event.set_unix_ms(absl::ToUnixMillis(absl::Now()));
        event.set_kind(std::string(kind));
        event.set_session_id(session);
        watch->Publish(event);
      });
  OperatorPolicy operators;
  operators.uids.assign(config.operator_uids.begin(),
                        config.operator_uids.end());
  operators.gids.assign(config.operator_gids.begin(),
                        config.operator_gids.end());
  operators.cert_names = config.operator_cert_names;
  daemon->connections_ =
      std::make_unique<ConnectionRegistry>(std::move(operators));
  DaemonServer* const failing = daemon.get();
  if (daemon->group_ != nullptr) {
    // The group's daemons are operators of each other (a TLS client
    // certificate in --operator_cert_names); any caller only with
    // --insecure_tcp_for_testing.
    if (absl::Status attached = daemon->group_->Attach(
            daemon->engine_.get(), daemon->backend_.get(), daemon->hub_.get(),
            daemon->sessions_.get(),
            config.insecure_tcp_for_testing ? nullptr
                                            : daemon->connections_.get(),
            [failing](const absl::Status& cause) { failing->Fail(cause); });
        !attached.ok()) {
      return attached;
    }
    CpGroupRuntime* const group = daemon->group_.get();
    group_status = [group] { return group->Status(); };
  }
  DaemonInfo info{
      .build = GetBuildInfo(),
      .config = config,
      .start_time = clock->Now(),
      .listen_address = address,
      .pid = getpid(),
  };
  daemon->leader_view_ = std::move(leader_view);
  daemon->service_ = std::make_unique<service::HiCacheService>(
      std::move(info), clock,
      service::ServiceParts{.engine = daemon->engine_.get(),
                            .sessions = daemon->sessions_.get(),
                            .hub = daemon->hub_.get(),
                            .watch = watch,
                            .callers = daemon->connections_.get(),
                            .group = daemon->group_ != nullptr
                                          ? daemon->group_.get()
                                          : daemon->leader_view_.get(),
                            .group_status = std::move(group_status),
                            .kv_events = daemon->kv_events_.get()},
      service::StreamLimits{
          .max_backlog = static_cast<size_t>(config.max_stream_backlog)});
  // The unix socket is accepted by our own listener, which records each
  // peer's credentials for roles and bounds the connections.
  DaemonServer* const self = daemon.get();
  const SocketListener::Options listener_options{
      .max_connections = static_cast<int>(
          std::min<int64_t>(config.max_connections, 1 << 20)),
      .on_fatal = [self](const absl::Status& status) { self->Fail(status); }};
  absl::StatusOr<std::unique_ptr<SocketListener>> listener =
      SocketListener::BindUnix(socket_path, listener_options,
                               daemon->connections_.get());
  if (!listener.ok()) return listener.status();
  daemon->listener_ = *std::move(listener);
  // TCP likewise: bound here (a taken port fails the start), accepted by
  // our listener, the TLS handshake gRPC's.
  if (!config.listen_tcp.empty()) {
    daemon->tcp_connections_ =
        std::make_unique<ConnectionRegistry>(OperatorPolicy{});
    absl::StatusOr<std::unique_ptr<SocketListener>> tcp =
        SocketListener::BindTcp(config.listen_tcp, listener_options,
                                daemon->tcp_connections_.get());
    if (!tcp.ok()) return tcp.status();
    daemon->tcp_listener_ = *std::move(tcp);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  // Bytes gRPC queues for one stream beyond the peer's flow-control window
  // before a write blocks: past it, a slow reader's events wait in the
  // stream's bounded mailbox (--max_stream_backlog), not in gRPC.
  builder.AddChannelArgument("grpc.http2.write_buffer_size", 256 << 10);
  grpc::ResourceQuota quota("hicached");
  quota.SetMaxThreads(static_cast<int>(
      std::min<int64_t>(config.max_rpc_threads, 1 << 20)));
  builder.SetResourceQuota(quota);
  int tcp_port = 0;
  if (daemon->tcp_listener_ != nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        TcpCredentials(config);
    if (!credentials.ok()) return credentials.status();
    // A TCP connection holds one of --max_connections' slots from its
    // accept: one that never finishes its TLS handshake gives it back
    // after 10 s, not gRPC's default 120 s.
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
    daemon->tcp_acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        *credentials);
    tcp_port = daemon->tcp_listener_->port();
  }
  builder.RegisterService(daemon->service_.get());
  if (daemon->group_ != nullptr && daemon->group_->service() != nullptr) {
    builder.RegisterService(daemon->group_->service());
  }
  {
    std::vector<std::unique_ptr<
        grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(daemon->calls_->MakeFactory());
    if (daemon->metrics_ != nullptr) {
      interceptors.push_back(daemon->metrics_->MakeInterceptorFactory());
    }
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!config.listen_tcp.empty() && tcp_port == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "gRPC could not listen on ", address,
        config.listen_tcp.empty() ? ""
                                  : absl::StrCat(" and ", config.listen_tcp)));
  }
  daemon->tcp_port_ = tcp_port;
  if (absl::Status mode = daemon->socket_->SetSocketMode(0660); !mode.ok()) {
    server->Shutdown();
    return mode;
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kHealthServiceName, true);
  daemon->server_ = std::move(server);
  if (daemon->metrics_ != nullptr) {
    daemon->metrics_->Watch(daemon->engine_.get(), daemon->sessions_.get());
    if (daemon->kv_events_ != nullptr) {
      events::KvEventPublisher* const publisher = daemon->kv_events_.get();
      daemon->metrics_->WatchKvEvents([publisher] { return publisher->stats(); });
    }
    if (daemon->group_ != nullptr) {
      // The group's series; StopServing runs before the group goes.
      CpGroupRuntime* const group = daemon->group_.get();
      daemon->metrics_->WatchGroup([group] { return group->Status(); });
    }
  }
  daemon->listener_->Start(daemon->server_.get());
  if (daemon->tcp_listener_ != nullptr) {
    grpc::experimental::ExternalConnectionAcceptor* const acceptor =
        daemon->tcp_acceptor_.get();
    daemon->tcp_listener_->Start([acceptor](int listener_fd, int fd) {
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters
          connection;
      connection.listener_fd = listener_fd;
      connection.fd = fd;
      acceptor->HandleNewConnection(&connection);
    });
  }
  if (daemon->group_ != nullptr) {
    if (absl::Status started =
            daemon->group_->Start(daemon->server_.get(), tcp_port);
        !started.ok()) {
      return started;
    }
  }
  DaemonServer* raw = daemon.get();
  daemon->reaper_ = std::thread([raw, paranoid = config.paranoid_checks] {
    raw->ReapLeases(paranoid);
  });
  return daemon;
}

void DaemonServer::ReapLeases(bool paranoid_checks) {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (!shut_down_)
        reaper_cv_.WaitWithTimeout(&mu_, absl::Milliseconds(200));
      if (shut_down_) return;
    }
    const int expired = sessions_->ExpireLapsed();
    if (paranoid_checks && expired > 0) {
      if (absl::Status s = engine_->CheckInvariants(); !s.ok()) {
        spdlog::error("paranoid check after {} lease expiries: invariant "
                      "violated: {}",
                      expired, s);
      } else {
        spdlog::info("paranoid check after {} lease expiries: invariants hold",
                     expired);
      }
    }
  }
}

DaemonServer::~DaemonServer() {
  if (metrics_ != nullptr) metrics_->StopServing();
  Shutdown(absl::ZeroDuration());
  Wait();
  // Says Bye to the group and stops its threads while the engine and the
  // backend still exist.
  if (group_ != nullptr) group_->Stop();
  if (reaper_.joinable()) reaper_.join();
  // The engine stops calling the publisher, which then goes first.
  if (kv_events_ != nullptr && engine_ != nullptr) {
    engine_->DetachTierListener();
  }
  std::thread failer;
  {
    MutexLock lock(&mu_);
    failer = std::move(failer_);
  }
  if (failer.joinable()) failer.join();
}

void DaemonServer::Fail(const absl::Status& status) {
  MutexLock lock(&mu_);
  if (!failure_.ok() || shut_down_) return;
  failure_ = status;
  // Running RPCs get a second: the daemon is going away either way.
  failer_ = std::thread([this] { Shutdown(absl::Seconds(1)); });
}

absl::Status DaemonServer::failure() const {
  MutexLock lock(&mu_);
  return failure_;
}

void DaemonServer::Shutdown(absl::Duration grace) {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    reaper_cv_.SignalAll();
  }
  if (listener_ != nullptr) listener_->Stop();
  if (tcp_listener_ != nullptr) tcp_listener_->Stop();
  if (server_ == nullptr) return;  // Start() failed half-way.
  server_->GetHealthCheckService()->SetServingStatus(false);
  // gRPC's shutdown waits for every connection to close, and a client that
  // keeps an idle channel open does not close it: the daemon would wait the
  // whole grace. Once no call is left (or the grace is over), the
  // connections are shut down, which ends them at once.
  const absl::Time deadline = absl::Now() + grace;
  std::thread closer([this, deadline] {
    calls_->WaitIdle(deadline);
    connections_->ShutdownAll();
    if (tcp_connections_ != nullptr) tcp_connections_->ShutdownAll();
  });
  server_->Shutdown(absl::ToChronoTime(deadline));
  closer.join();
}

int DaemonServer::metrics_port() const {
  return metrics_ == nullptr ? 0 : metrics_->port();
}

void DaemonServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace hicache
