#pragma once

// GrpcRendezvousStore: a gloo::rendezvous::Store over a CP group leader's
// RendezvousSet / RendezvousGet RPCs (proto/hicache/internal/v1/
// cp_group.proto), so that a follower's Gloo link rendezvouses with the
// leader across nodes without a shared filesystem (docs/cp-groups.md,
// "Bootstrap: Join and rendezvous"). The leader side serves the same keys
// from its InMemoryRendezvousKv (daemon/group/rendezvous_kv.h) and uses it
// directly for its own end (KvGlooStore). Gloo's Store contract (what
// throws, when) is RendezvousGlooStore's (rendezvous_gloo_store.h); an RPC
// failure or a refused set is a gloo::IoException.
//
// Waiting is server-side: RendezvousGet carries `wait_ms` and the leader
// blocks on a condition variable until the key is set. The client repeats
// a Get only when the server cut a wait shorter than asked (its cap), so
// a wait costs one RPC per cap interval, never a polling loop.
//
// Thread-safe (a gRPC stub is); every RPC has a deadline.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/main/rendezvous_gloo_store.h"
#include "grpcpp/grpcpp.h"
#include "hicache/internal/v1/cp_group.grpc.pb.h"

namespace hicache {

struct GrpcRendezvousStoreOptions {
  // get() waits this long; wait(keys) without a timeout too (Gloo's
  // default).
  absl::Duration timeout = absl::FromChrono(
      std::chrono::milliseconds(gloo::rendezvous::Store::kDefaultTimeout));
  // Deadline of a RendezvousSet, and slack added to a waiting Get's.
  absl::Duration rpc_timeout = absl::Seconds(10);
};

class GrpcRendezvousStore final : public RendezvousGlooStore {
 public:
  GrpcRendezvousStore(
      std::shared_ptr<hicache::internal::v1::CpGroup::StubInterface> stub,
      GrpcRendezvousStoreOptions options = {});

  // The Gloo operations' statuses (RendezvousGlooStore makes them Gloo's).
  absl::Status Set(const std::string& key, const std::string& value) override;
  // NOT_FOUND when the key is still absent after `wait`; DEADLINE_EXCEEDED
  // or UNAVAILABLE when the leader does not answer.
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration wait) override;

 private:
  const std::shared_ptr<hicache::internal::v1::CpGroup::StubInterface> stub_;
  const GrpcRendezvousStoreOptions options_;
};

}  // namespace hicache
