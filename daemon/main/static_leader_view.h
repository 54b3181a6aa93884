#pragma once

#include <string>
#include <utility>

#include "daemon/group/leader_view.h"

namespace hicache {

// A LeaderView that never changes: what --cp_group_test_non_leader_of gives
// a daemon so that tests can run a real follower's redirects without a CP
// group (TEST ONLY; hicached_main.cc gates it behind
// --insecure_tcp_for_testing). Thread-safe (immutable).
class StaticLeaderView final : public LeaderView {
 public:
  StaticLeaderView(bool leader, std::string leader_address)
      : leader_(leader), leader_address_(std::move(leader_address)) {}

  bool IsLeader() const override { return leader_; }
  std::string LeaderAddress() const override { return leader_address_; }

 private:
  const bool leader_;
  const std::string leader_address_;
};

}  // namespace hicache
