#include "daemon/main/socket_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// Credentials that never make an operator.
PeerCredentials UnknownCredentials() {
  PeerCredentials peer;
  peer.uid = static_cast<uid_t>(-1);
  peer.gid = static_cast<gid_t>(-1);
  return peer;
}

PeerCredentials CredentialsOf(int fd) {
  PeerCredentials peer;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
  } else {
    peer = UnknownCredentials();
  }
#ifdef SO_PEERGROUPS
  std::vector<gid_t> groups(64);
  socklen_t size = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &size) != 0 &&
      errno == ERANGE) {
    groups.resize(size / sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &size) != 0) {
      size = 0;
    }
  }
  groups.resize(size / sizeof(gid_t));
  peer.groups = std::move(groups);
#endif
  return peer;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SocketListener>> SocketListener::BindUnix(
    const std::string& path, Options options, ConnectionRegistry* registry) {
  struct sockaddr_un addr;
  std::memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is longer than ",
                     sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("socket(): ", std::strerror(errno)));
  }
  // The umask makes the socket 0660 from its first instant.
  const mode_t old_umask = umask(0117);
  const int bound =
      bind(fd, reinterpret_cast<const struct sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0 || listen(fd, options.backlog) != 0) {
    const int err = bound != 0 ? bind_errno : errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<SocketListener>(new SocketListener(
      fd, "the unix socket", /*unix_socket=*/true, /*port=*/0, options,
      registry));
}

absl::StatusOr<std::unique_ptr<SocketListener>> SocketListener::BindTcp(
    const std::string& host_port, Options options,
    ConnectionRegistry* registry) {
  // "host:port", "[v6]:port" or ":port"; the port after the last colon.
  const size_t colon = host_port.rfind(':');
  int port = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(host_port).substr(colon + 1),
                        &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TCP address '", host_port, "' is not host:port (port 0..65535)"));
  }
  absl::string_view host = absl::string_view(host_port).substr(0, colon);
  if (absl::ConsumePrefix(&host, "[") && !absl::ConsumeSuffix(&host, "]")) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP address '", host_port, "': unbalanced '['"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  // No host: every address, IPv6 and IPv4 alike ("::" dual-stack, as
  // gRPC's own listener), else IPv4's.
  const std::string host_name(host.empty() ? "::" : host);
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host_name.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 && host.empty()) {
    rc = getaddrinfo("0.0.0.0", service.c_str(), &hints, &found);
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TCP address '", host_port, "': ", gai_strerror(rc)));
  }
  int last_errno = 0;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // "[::]" serves IPv4 too, as gRPC's own listener does.
    if (a->ai_family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        listen(fd, options.backlog) == 0) {
      break;
    }
    last_errno = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on TCP ", host_port, ": ", std::strerror(last_errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    port = ntohs(bound.ss_family == AF_INET6
                     ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                     : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  return std::unique_ptr<SocketListener>(
      new SocketListener(fd, absl::StrCat("TCP ", host_port),
                         /*unix_socket=*/false, port, options, registry));
}

SocketListener::SocketListener(int fd, std::string what, bool unix_socket,
                               int port, Options options,
                               ConnectionRegistry* registry)
    : fd_(fd),
      what_(std::move(what)),
      unix_socket_(unix_socket),
      port_(port),
      options_(options),
      registry_(registry) {
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

SocketListener::~SocketListener() {
  Stop();
  close(fd_);
  if (spare_fd_ >= 0) close(spare_fd_);
}

void SocketListener::Start(HandOff hand_off) {
  thread_ = std::thread(
      [this, hand_off = std::move(hand_off)] { AcceptLoop(hand_off); });
}

void SocketListener::Start(grpc::Server* server) {
  Start([server](int, int fd) { grpc::AddInsecureChannelFromFd(server, fd); });
}

void SocketListener::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // Wakes the blocked accept() (it fails with EINVAL).
  shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

int64_t SocketListener::refused() const {
  MutexLock lock(&mu_);
  return refused_;
}

void SocketListener::CountRefused() {
  MutexLock lock(&mu_);
  ++refused_;
}

void SocketListener::ShedOne() {
  if (spare_fd_ >= 0) {
    close(spare_fd_);
    spare_fd_ = -1;
  }
  const int fd = options_.accept(fd_, SOCK_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    CountRefused();
  }
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Nothing could be shed (every descriptor is taken by others): back off
  // briefly rather than spin on accept().
  if (fd < 0 && spare_fd_ < 0) absl::SleepFor(absl::Milliseconds(10));
}

void SocketListener::AcceptLoop(HandOff hand_off) {
  bool warned_fds = false;
  bool warned_memory = false;
  while (true) {
    const int fd = options_.accept(fd_, SOCK_CLOEXEC | SOCK_NONBLOCK);
    {
      MutexLock lock(&mu_);
      if (stopping_) {
        if (fd >= 0) close(fd);
        return;
      }
    }
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        if (!warned_fds) {
          spdlog::error(
              "out of file descriptors: {} refuses new connections until "
              "some close (raise LimitNOFILE / ulimit -n)",
              what_);
          warned_fds = true;
        }
        ShedOne();
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN ||
          errno == EPROTO) {
        continue;
      }
      // accept(2): on TCP, network errors already pending on the new
      // connection (and a firewall's EPERM) are the connection's, not the
      // listener's: retry, as for EAGAIN.
      if (!unix_socket_ &&
          (errno == ENETDOWN || errno == ENOPROTOOPT || errno == EHOSTDOWN ||
           errno == ENONET || errno == EHOSTUNREACH || errno == EOPNOTSUPP ||
           errno == ENETUNREACH || errno == EPERM)) {
        continue;
      }
      if (errno == ENOBUFS || errno == ENOMEM) {
        // The kernel is short of socket memory: the pending connection
        // waits in the backlog, so retry shortly instead of giving up.
        if (!warned_memory) {
          spdlog::warn("accept on {}: {}; retrying", what_,
                       std::strerror(errno));
          warned_memory = true;
        }
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      const absl::Status failure = absl::UnavailableError(
          absl::StrCat("accept on ", what_, " failed: ",
                       std::strerror(errno),
                       "; no new connection can be served"));
      spdlog::error("{}", std::string(failure.message()));
      if (options_.on_fatal) options_.on_fatal(failure);
      return;
    }
    warned_fds = false;
    warned_memory = false;
    if (registry_->size() >= static_cast<size_t>(options_.max_connections) &&
        registry_->Sweep() >= static_cast<size_t>(options_.max_connections)) {
      spdlog::warn(
          "{}: refusing a connection: {} are open (--max_connections)",
          what_, options_.max_connections);
      close(fd);
      CountRefused();
      continue;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      continue;
    }
    if (!unix_socket_) {
      // gRPC's own listener asks for low latency: no Nagle delay.
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    // A TCP peer proves nothing by its socket (TLS names it later).
    registry_->Add(fd, st.st_ino,
                   unix_socket_ ? CredentialsOf(fd) : UnknownCredentials());
    // gRPC owns the descriptor from here and closes it with the connection.
    hand_off(fd_, fd);
  }
}

}  // namespace hicache
