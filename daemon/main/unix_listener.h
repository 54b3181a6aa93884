#pragma once

#include <sys/socket.h>

#include <functional>

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/main/connection_registry.h"
#include "grpcpp/server.h"

namespace hicache {

// The daemon's unix-socket listener. It accepts connections itself, records
// each peer's credentials (SO_PEERCRED, SO_PEERGROUPS) in a
// ConnectionRegistry, and hands the connection to the gRPC server. Doing the
// accept here gives the service the peer's uid for roles, bounds the number
// of connections, and survives descriptor exhaustion: when accept() fails
// with EMFILE/ENFILE, a spare descriptor is released to accept and close the
// pending connection, so the listener never wedges and accepts again as soon
// as descriptors are free. Other transient failures (ENOBUFS, ENOMEM) back
// off briefly and retry. A failure that retrying cannot fix (the listening
// socket itself is broken) is reported once through Options::on_fatal: the
// daemon can no longer take connections and must not look healthy.
//
// Lifetime: Bind() -> Start(server) -> Stop() (also by the destructor). The
// socket file itself belongs to SocketGuard.
class UnixListener {
 public:
  struct Options {
    // Open connections at most; one more is accepted and closed at once.
    int max_connections = 1024;
    int backlog = 256;
    // Called at most once, on the accept thread, when accept() fails for
    // good; the accept loop has then ended. It must not call Stop() itself
    // (Stop() joins that thread). Unset: the failure is only logged.
    std::function<void(const absl::Status&)> on_fatal;
    // accept4(2) on the listening socket; tests substitute failures.
    std::function<int(int fd, int flags)> accept = [](int fd, int flags) {
      return accept4(fd, nullptr, nullptr, flags);
    };
  };

  // Binds `path` (created with mode 0660) and listens. The registry must
  // outlive the listener.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(
      const std::string& path, Options options, ConnectionRegistry* registry);

  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts on a thread and adds every connection to `server` (started, and
  // alive until Stop()).
  void Start(grpc::Server* server) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops accepting and joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Connections refused: over max_connections, or while out of descriptors.
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  UnixListener(int fd, Options options, ConnectionRegistry* registry);
  void AcceptLoop(grpc::Server* server) ABSL_LOCKS_EXCLUDED(mu_);
  // accept() failed with EMFILE/ENFILE: take one pending connection with the
  // spare descriptor and close it.
  void ShedOne() ABSL_LOCKS_EXCLUDED(mu_);
  void CountRefused() ABSL_LOCKS_EXCLUDED(mu_);

  const int fd_;
  const Options options_;
  ConnectionRegistry* const registry_;
  int spare_fd_ = -1;  // Only the accept thread touches it.
  std::thread thread_;
  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hicache
