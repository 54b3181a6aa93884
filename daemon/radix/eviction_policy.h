#pragma once

#include <cstdint>
#include <tuple>

#include "daemon/core/policies.h"

namespace hicache {

// The EvictionPolicy enum and its names are configuration vocabulary
// (daemon/core/policies.h); this header is what the tree does with one.

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
