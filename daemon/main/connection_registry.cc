#include "daemon/main/connection_registry.h"

#include <sys/socket.h>

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// The inode of the socket behind `fd`, or 0 if it is no socket.
ino_t SocketInode(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

template <typename T>
bool Contains(const std::vector<T>& list, T value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace

bool OperatorPolicy::IsOperator(const PeerCredentials& peer) const {
  if (peer.uid == 0 || Contains(uids, peer.uid)) return true;
  if (Contains(gids, peer.gid)) return true;
  for (gid_t group : peer.groups) {
    if (Contains(gids, group)) return true;
  }
  return false;
}

bool OperatorPolicy::IsOperatorCert(const std::string& common_name) const {
  return !common_name.empty() && Contains(cert_names, common_name);
}

ConnectionRegistry::ConnectionRegistry(OperatorPolicy policy)
    : policy_(std::move(policy)) {}

void ConnectionRegistry::Add(int fd, ino_t inode, PeerCredentials peer) {
  MutexLock lock(&mu_);
  entries_[fd] = Entry{inode, std::move(peer)};
}

size_t ConnectionRegistry::Sweep() {
  MutexLock lock(&mu_);
  absl::erase_if(entries_, [](const auto& entry) {
    return SocketInode(entry.first) != entry.second.inode;
  });
  return entries_.size();
}

size_t ConnectionRegistry::ShutdownAll() {
  MutexLock lock(&mu_);
  size_t done = 0;
  for (const auto& [fd, entry] : entries_) {
    // Only a descriptor that still is this connection's socket.
    if (SocketInode(fd) == entry.inode && shutdown(fd, SHUT_RDWR) == 0) ++done;
  }
  return done;
}

size_t ConnectionRegistry::size() const {
  MutexLock lock(&mu_);
  return entries_.size();
}

Caller ConnectionRegistry::ResolvePeer(
    const std::string& peer, const std::vector<std::string>& cert_names) const {
  for (const std::string& name : cert_names) {
    if (policy_.IsOperatorCert(name)) {
      return Caller::Operator(absl::StrCat("certificate CN=", name),
                              absl::StrCat("cert CN=", name));
    }
  }
  if (!cert_names.empty()) {
    return Caller::Client(absl::StrCat("certificate CN=", cert_names.front()),
                          absl::StrCat("cert CN=", cert_names.front()));
  }
  int fd = -1;
  spdlog::debug("resolving peer '{}'", peer);
  if (!absl::StartsWith(peer, "fd:") ||
      !absl::SimpleAtoi(absl::string_view(peer).substr(3), &fd)) {
    // A TCP peer that no certificate names (TLS without client
    // certificates, or one without a common name): its sessions are bound
    // to its address, the port aside ("ipv4:10.0.0.7:5312" -> "host
    // ipv4:10.0.0.7"), so that a reconnect keeps them and another machine
    // cannot use them. Anything else proves nothing (empty principal).
    std::string principal;
    if (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:")) {
      const size_t colon = peer.rfind(':');
      if (colon > 5) principal = absl::StrCat("host ", peer.substr(0, colon));
    }
    return Caller::Client(absl::StrCat("peer ", peer), std::move(principal));
  }
  MutexLock lock(&mu_);
  auto it = entries_.find(fd);
  if (it == entries_.end() || SocketInode(fd) != it->second.inode) {
    spdlog::debug("peer {}: no registered connection; a plain client", peer);
    return Caller::Client("an unknown unix peer");
  }
  const PeerCredentials& creds = it->second.peer;
  std::string name = absl::StrCat("uid ", creds.uid, " pid ", creds.pid);
  std::string principal = absl::StrCat("uid ", creds.uid);
  return policy_.IsOperator(creds)
             ? Caller::Operator(std::move(name), std::move(principal))
             : Caller::Client(std::move(name), std::move(principal));
}

Caller ConnectionRegistry::Resolve(const grpc::ServerContext& context) const {
  std::vector<std::string> names;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& value :
         auth->FindPropertyValues("x509_common_name")) {
      names.emplace_back(value.data(), value.size());
    }
  }
  return ResolvePeer(context.peer(), names);
}

}  // namespace hicache
