#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_types.h"

namespace hicache {

// What the service layer needs to know of this daemon's place in a CP
// group (docs/cp-groups.md): whether it is the leader, which alone keeps the
// radix tree and the page metadata, and where the leader is. A standalone
// daemon has no LeaderView (the service is given nullptr) and serves
// everything itself.
//
// Thread-safe: read by every RPC handler, concurrently with the group's own
// threads changing what it reports.
class LeaderView {
 public:
  virtual ~LeaderView() = default;

  // True on the leader. A follower forwards schedulers to LeaderAddress().
  virtual bool IsLeader() const = 0;

  // The leader's gRPC target ("host:port"), as schedulers reach it; empty
  // while it is not known (e.g. before the follower joined).
  virtual std::string LeaderAddress() const = 0;

  // A follower (docs/cp-groups.md, "Worker events and acks across the
  // link"): relays the layer_stored of a local worker session of namespace
  // `ns` and rank `rank` to the leader, which stores it as that worker would
  // (SessionManager::NamespaceLayerStored), and returns the leader's answer
  // (UNAVAILABLE while the leader is not reachable). The service calls it
  // only on a daemon that is not the leader, with no fences (it refuses
  // those itself). The default: UNIMPLEMENTED.
  virtual absl::Status ForwardLayerStored(
      const std::string& /*ns*/, Rank /*rank*/, uint32_t /*step*/,
      absl::Span<const uint64_t> /*ops*/,
      absl::Span<const RankFence> /*fences*/) const {
    return absl::UnimplementedError(
        "this daemon cannot relay worker acks to its CP group leader");
  }
};

}  // namespace hicache
