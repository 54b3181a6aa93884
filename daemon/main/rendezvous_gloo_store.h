#pragma once

// RendezvousGlooStore: Gloo's rendezvous::Store contract over two status
// calls, Set(key, value) and Get(key, wait), which a subclass provides: a
// CP group follower's over the leader's RPCs (GrpcRendezvousStore), the
// leader's own over its in-memory store (KvGlooStore). docs/cp-groups.md,
// "Bootstrap: Join and rendezvous".
//
// Gloo's contract, mirrored from its FileStore:
//  * get(key) waits for the key up to `timeout`, then throws;
//  * wait(keys, timeout) returns once every key is set, or throws
//    gloo::IoException "Wait timeout for key(s): ..." after `timeout`;
//  * any failure (a refused set, an unreachable store) throws
//    gloo::IoException (a std::exception). Gloo's callers expect exceptions
//    from a Store; the one caller in this code base,
//    GlooCommunicator::Connect, catches std::exception, so nothing escapes
//    daemon/comm.

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/group/join_handler.h"
#include "gloo/rendezvous/store.h"

namespace hicache {

class RendezvousGlooStore : public gloo::rendezvous::Store {
 public:
  // get() waits this long; wait(keys) without a timeout too.
  explicit RendezvousGlooStore(absl::Duration timeout) : timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) final;
  std::vector<char> get(const std::string& key) final;
  void wait(const std::vector<std::string>& keys) final;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) final;

  // Stores `value` under `key` (write-once, see group::RendezvousKv).
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;
  // The value under `key`, waiting up to `wait`; NOT_FOUND when it is
  // still absent then.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration wait) = 0;

 private:
  const absl::Duration timeout_;
};

// The store over a group::RendezvousKv in this process (a CP group
// leader's own end of each link). `kv` must outlive it.
class KvGlooStore final : public RendezvousGlooStore {
 public:
  KvGlooStore(group::RendezvousKv* kv, absl::Duration timeout)
      : RendezvousGlooStore(timeout), kv_(kv) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    return kv_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration wait) override {
    return kv_->Get(key, wait);
  }

 private:
  group::RendezvousKv* const kv_;
};

}  // namespace hicache
