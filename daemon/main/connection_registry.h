#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "daemon/core/mutex.h"
#include "daemon/service/caller_resolver.h"

namespace hicache {

// What the kernel says about the process at the other end of a unix socket
// (SO_PEERCRED, SO_PEERGROUPS), taken when the connection was accepted.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // Supplementary groups.
};

// Who is an operator: root, a listed uid, a member of a listed group (primary
// or supplementary), or a TLS client whose certificate's common name is
// listed.
struct OperatorPolicy {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;
  std::vector<std::string> cert_names;

  bool IsOperator(const PeerCredentials& peer) const;
  bool IsOperatorCert(const std::string& common_name) const;
};

// The unix-socket connections the daemon accepted, by file descriptor, with
// their peer credentials; resolves a call's Caller from its peer string.
//
// gRPC names a connection handed over by descriptor "fd:<n>". A descriptor
// number is reused once gRPC closes the connection, so every entry also
// records the socket's inode: a call whose descriptor now refers to another
// socket, or to none, is resolved as an unknown client, never as whoever
// held the number before.
//
// Thread-safe.
class ConnectionRegistry final : public service::CallerResolver {
 public:
  explicit ConnectionRegistry(OperatorPolicy policy);

  void Add(int fd, ino_t inode, PeerCredentials peer) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets connections whose descriptor no longer refers to their socket
  // (gRPC closed them); returns how many are live.
  size_t Sweep() ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Shuts down (shutdown(2), both directions) every connection whose
  // descriptor still refers to its socket: gRPC then sees them end. For the
  // daemon's shutdown, once no call is left. Returns how many.
  size_t ShutdownAll() ABSL_LOCKS_EXCLUDED(mu_);

  Caller Resolve(const grpc::ServerContext& context) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same, from a peer string and TLS common names (for tests).
  Caller ResolvePeer(const std::string& peer,
                     const std::vector<std::string>& cert_names) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    ino_t inode = 0;
    PeerCredentials peer;
  };

  const OperatorPolicy policy_;
  mutable Mutex mu_;
  absl::flat_hash_map<int, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
