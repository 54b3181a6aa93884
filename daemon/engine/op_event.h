#pragma once

// One event of a backup or load: what the engine reports (EngineListener),
// what the EventHub routes to streams and subscribers, and what the service
// turns into its proto messages. The only shape a completion takes between
// the engine and the wire.

#include <cstdint>
#include <string>
#include <utility>

#include "daemon/layout/cp_layout.h"
#include "daemon/radix/radix_tree.h"

namespace hicache {

struct OpEvent {
  enum class Type {
    kBackupStep,  // One layer step of one rank stored on the host.
    kCommitted,   // The backup's host copy is its node's (last event).
    kRolledBack,  // The backup will never commit (last event).
    kLoadStep,    // One layer step of one rank loaded to the device.
    kLoadDone     // The load ended, attached (`ok`) or a miss (last event).
  };
  Type type = Type::kBackupStep;
  uint64_t op = 0;
  Rank rank = 0;
  uint32_t step = 0;
  NodeId node = kNoNode;
  bool ok = true;
  std::string fence;  // kLoadStep: the backend's "layer landed" event.

  static OpEvent BackupStep(uint64_t op, Rank rank, uint32_t step) {
    return {Type::kBackupStep, op, rank, step};
  }
  static OpEvent Committed(uint64_t op, NodeId node) {
    return {Type::kCommitted, op, 0, 0, node};
  }
  static OpEvent RolledBack(uint64_t op) { return {Type::kRolledBack, op}; }
  // `fence`: see StepDone::fence (empty on the CPU backend).
  static OpEvent LoadStep(uint64_t op, Rank rank, uint32_t step,
                          std::string fence) {
    return {Type::kLoadStep, op, rank, step, kNoNode, true, std::move(fence)};
  }
  static OpEvent LoadDone(uint64_t op, bool ok, NodeId node = kNoNode) {
    return {Type::kLoadDone, op, 0, 0, node, ok};
  }
  // The operation's last event.
  bool terminal() const {
    return type == Type::kCommitted || type == Type::kRolledBack ||
           type == Type::kLoadDone;
  }
};

}  // namespace hicache
