#include "daemon/radix/eviction_policy.h"

namespace hicache {

int FrequencyClass(uint32_t frequency) { return frequency >= 2 ? 1 : 0; }

bool UsesFrequencySketch(EvictionPolicy policy) {
  return policy == EvictionPolicy::kTinyLfu;
}

EvictionKey MakeEvictionKey(EvictionPolicy policy, const EvictionFacts& facts,
                            uint64_t tiebreak, EvictionTier tier) {
  switch (policy) {
    case EvictionPolicy::kLru:
      return {facts.last_access_ns, 0, tiebreak};
    case EvictionPolicy::kLfu:
      return {facts.hit_count, facts.last_access_ns, tiebreak};
    case EvictionPolicy::kFifo:
      return {facts.created_ns, 0, tiebreak};
    case EvictionPolicy::kPriority:
      return {facts.priority, facts.last_access_ns, tiebreak};
    case EvictionPolicy::kSlru:
      return {facts.hit_count >= 2 ? 1 : 0, facts.last_access_ns, tiebreak};
    case EvictionPolicy::kTinyLfu:
      if (tier == EvictionTier::kDevice) {
        return {facts.last_access_ns, 0, tiebreak};
      }
      return {facts.last_access_tick +
                  (FrequencyClass(facts.frequency) == 1 ? facts.reuse_credit
                                                        : 0),
              facts.last_access_ns, tiebreak};
  }
  return {0, 0, tiebreak};
}

}  // namespace hicache
