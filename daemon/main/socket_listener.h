#pragma once

#include <sys/socket.h>

#include <cstdint>
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

// One of the daemon's listening sockets (the unix socket, and the TCP
// listener of --listen_tcp). It accepts connections itself, records each in
// a ConnectionRegistry (with the peer's credentials, SO_PEERCRED and
// SO_PEERGROUPS, on the unix socket), and hands the connection to the gRPC
// server. Doing the accept here gives the service the unix peer's uid for
// roles, bounds the number of connections, and survives descriptor
// exhaustion on both transports: when accept() fails with EMFILE/ENFILE, a
// spare descriptor is released to accept and close the pending connection,
// so the listener never wedges and accepts again as soon as descriptors are
// free (gRPC's own TCP acceptor stops for good after an EMFILE). Other
// transient failures (ENOBUFS, ENOMEM) back off briefly and retry. A failure
// that retrying cannot fix (the listening socket itself is broken) is
// reported once through Options::on_fatal: the daemon can no longer take
// connections and must not look healthy.
//
// Lifetime: BindUnix()/BindTcp() -> Start() -> Stop() (also by the
// destructor). A unix socket's file belongs to SocketGuard.
class SocketListener {
 public:
  struct Options {
    // Open connections at most (counted in the registry); one more is
    // accepted and closed at once.
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
  // Gives an accepted connection (`fd`, accepted on `listener_fd`) to the
  // gRPC server, which owns it from then on.
  using HandOff = std::function<void(int listener_fd, int fd)>;

  // Binds the unix socket `path` (created with mode 0660) and listens. The
  // registry must outlive the listener; it learns each peer's credentials.
  static absl::StatusOr<std::unique_ptr<SocketListener>> BindUnix(
      const std::string& path, Options options, ConnectionRegistry* registry);
  // Binds "host:port" ("[::]:port" for IPv6, port 0 for any free one) with
  // SO_REUSEADDR and listens. The registry (one of its own: TCP peers have
  // no credentials, their identity is TLS's) counts the connections.
  static absl::StatusOr<std::unique_ptr<SocketListener>> BindTcp(
      const std::string& host_port, Options options,
      ConnectionRegistry* registry);

  ~SocketListener();
  SocketListener(const SocketListener&) = delete;
  SocketListener& operator=(const SocketListener&) = delete;

  // Accepts on a thread and hands every connection off.
  void Start(HandOff hand_off) ABSL_LOCKS_EXCLUDED(mu_);
  // Accepts on a thread and adds every connection to `server` (started, and
  // alive until Stop()) as an insecure channel: the unix socket's way.
  void Start(grpc::Server* server) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops accepting and joins the thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Connections refused: over max_connections, or while out of descriptors.
  int64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);
  // The bound TCP port (0 for a unix socket).
  int port() const { return port_; }

 private:
  SocketListener(int fd, std::string what, bool unix_socket, int port,
                 Options options, ConnectionRegistry* registry);
  void AcceptLoop(HandOff hand_off) ABSL_LOCKS_EXCLUDED(mu_);
  // accept() failed with EMFILE/ENFILE: take one pending connection with the
  // spare descriptor and close it.
  void ShedOne() ABSL_LOCKS_EXCLUDED(mu_);
  void CountRefused() ABSL_LOCKS_EXCLUDED(mu_);

  const int fd_;
  const std::string what_;  // "the unix socket", "TCP 0.0.0.0:50051".
  const bool unix_socket_;
  const int port_;
  const Options options_;
  ConnectionRegistry* const registry_;
  int spare_fd_ = -1;  // Only the accept thread touches it.
  std::thread thread_;
  mutable Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hicache
