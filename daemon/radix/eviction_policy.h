#pragma once

#include <cstdint>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache {

// Order in which eviction picks victims among eligible leaves.
enum class EvictionPolicy {
  kLru,       // Least recently accessed first.
  kLfu,       // Fewest hits first, then least recently accessed.
  kFifo,      // Oldest created first.
  kPriority,  // Lowest priority first, then least recently accessed.
  kSlru,      // Segmented LRU: nodes hit once (probation) before nodes hit
              // again (protected segment); LRU inside each segment.
};

absl::string_view EvictionPolicyName(EvictionPolicy policy);
absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name);

// What a policy looks at. Smaller keys are evicted first.
struct EvictionFacts {
  int64_t last_access_ns = 0;
  int64_t created_ns = 0;
  uint32_t hit_count = 0;
  int32_t priority = 0;
};

using EvictionKey = std::tuple<int64_t, int64_t, uint64_t>;

// The sort key of a node under `policy`; `tiebreak` (the node id) makes the
// order total and deterministic.
EvictionKey MakeEvictionKey(EvictionPolicy policy, const EvictionFacts& facts,
                            uint64_t tiebreak);

}  // namespace hicache
