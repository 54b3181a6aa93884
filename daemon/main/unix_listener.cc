#include "daemon/main/unix_listener.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

PeerCredentials CredentialsOf(int fd) {
  PeerCredentials peer;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
  } else {
    // Unknown credentials never make an operator.
    peer.uid = static_cast<uid_t>(-1);
    peer.gid = static_cast<gid_t>(-1);
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

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(
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
  return std::unique_ptr<UnixListener>(new UnixListener(fd, options, registry));
}

UnixListener::UnixListener(int fd, Options options,
                           ConnectionRegistry* registry)
    : fd_(fd), options_(options), registry_(registry) {
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

UnixListener::~UnixListener() {
  Stop();
  close(fd_);
  if (spare_fd_ >= 0) close(spare_fd_);
}

void UnixListener::Start(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixListener::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  // Wakes the blocked accept() (it fails with EINVAL).
  shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

int64_t UnixListener::refused() const {
  MutexLock lock(&mu_);
  return refused_;
}

void UnixListener::CountRefused() {
  MutexLock lock(&mu_);
  ++refused_;
}

void UnixListener::ShedOne() {
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

void UnixListener::AcceptLoop(grpc::Server* server) {
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
              "out of file descriptors: refusing new connections until some "
              "close (raise LimitNOFILE / ulimit -n)");
          warned_fds = true;
        }
        ShedOne();
        continue;
      }
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN ||
          errno == EPROTO) {
        continue;
      }
      if (errno == ENOBUFS || errno == ENOMEM) {
        // The kernel is short of socket memory: the pending connection
        // waits in the backlog, so retry shortly instead of giving up.
        if (!warned_memory) {
          spdlog::warn("accept on the unix socket: {}; retrying",
                       std::strerror(errno));
          warned_memory = true;
        }
        absl::SleepFor(absl::Milliseconds(10));
        continue;
      }
      const absl::Status failure = absl::UnavailableError(
          absl::StrCat("accept on the unix socket failed: ",
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
      spdlog::warn("refusing a connection: {} are open (--max_connections)",
                   options_.max_connections);
      close(fd);
      CountRefused();
      continue;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      close(fd);
      continue;
    }
    registry_->Add(fd, st.st_ino, CredentialsOf(fd));
    // gRPC owns the descriptor from here and closes it with the connection.
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

}  // namespace hicache
