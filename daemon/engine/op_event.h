#pragma once

#include <cstdint>
#include <string>

#include "daemon/engine/engine_types.h"

namespace hicache {

// One event of a backup or load, as streamed to clients.
struct OpEvent {
  enum class Type {
    kBackupStep,
    kCommitted,
    kRolledBack,
    kLoadStep,
    kLoadDone
  };
  Type type = Type::kBackupStep;
  uint64_t op = 0;
  Rank rank = 0;
  uint32_t step = 0;
  NodeId node = kNoNode;
  bool ok = true;
  std::string fence;  // kLoadStep: the backend's "layer landed" event.
};

}  // namespace hicache
