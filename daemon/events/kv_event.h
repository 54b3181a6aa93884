#pragma once

// One KV event as routers see it (vLLM's BlockStored, BlockRemoved and
// AllBlocksCleared; docs/kv-events.md). Its hashes and tokens are views: the
// publisher keeps every queued event's in two contiguous buffers (no
// allocation per event) and encodes them on its own thread.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "daemon/radix/tier_listener.h"

namespace hicache::events {

struct KvEvent {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  Tier tier = Tier::kDevice;  // kStored, kRemoved.
  std::string topic;          // Where it is published.
  bool has_parent = false;    // kStored.
  uint64_t parent_hash = 0;
  absl::Span<const uint64_t> block_hashes;  // kStored, kRemoved.
  absl::Span<const int32_t> token_ids;      // kStored.
};

}  // namespace hicache::events
