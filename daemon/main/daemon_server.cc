#include "daemon/main/daemon_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/build_info.h"
#include "daemon/core/daemon_info.h"
#include "daemon/service/hicache_service.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace hicache {

absl::StatusOr<std::unique_ptr<DaemonServer>> DaemonServer::Start(
    const DaemonConfig& config, const std::string& socket_path,
    const Clock* clock) {
  if (absl::Status valid = config.Validate(); !valid.ok()) return valid;

  absl::StatusOr<std::unique_ptr<SocketGuard>> socket =
      SocketGuard::Acquire(socket_path);
  if (!socket.ok()) return socket.status();

  const std::string address = absl::StrCat("unix:", socket_path);
  DaemonInfo info{
      .build = GetBuildInfo(),
      .config = config,
      .start_time = clock->Now(),
      .listen_address = address,
      .pid = getpid(),
  };
  auto service =
      std::make_unique<service::HiCacheServiceImpl>(std::move(info), clock);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(service.get());

  // The socket is created by BuildAndStart(); a umask makes it 0660 from its
  // first instant, and SetSocketMode() below makes that explicit.
  const mode_t old_umask = umask(0117);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  umask(old_umask);
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("gRPC could not listen on ", address));
  }
  if (absl::Status mode = (*socket)->SetSocketMode(0660); !mode.ok()) {
    server->Shutdown();
    return mode;
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kHealthServiceName, true);

  std::unique_ptr<DaemonServer> daemon(
      new DaemonServer(*std::move(socket), address, std::move(service)));
  daemon->server_ = std::move(server);
  return daemon;
}

DaemonServer::DaemonServer(std::unique_ptr<SocketGuard> socket,
                           std::string listen_address,
                           std::unique_ptr<service::HiCacheServiceImpl> service)
    : socket_(std::move(socket)),
      listen_address_(std::move(listen_address)),
      service_(std::move(service)) {}

DaemonServer::~DaemonServer() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

void DaemonServer::Shutdown(absl::Duration grace) {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(grace));
}

void DaemonServer::Wait() { server_->Wait(); }

}  // namespace hicache
