#pragma once

// One KV event as routers see it (vLLM's BlockStored, BlockRemoved and
// AllBlocksCleared; docs/kv-events.md), owned: the publisher queues these
// and encodes them on its own thread.

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/radix/tier_listener.h"

namespace hicache::events {

struct KvEvent {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  Tier tier = Tier::kDevice;  // kStored, kRemoved.
  std::string topic;          // Where it is published.
  bool has_parent = false;    // kStored.
  uint64_t parent_hash = 0;
  std::vector<uint64_t> block_hashes;  // kStored, kRemoved.
  std::vector<int32_t> token_ids;      // kStored.
};

}  // namespace hicache::events
