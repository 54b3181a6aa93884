#pragma once

#include <string>

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
};

}  // namespace hicache
