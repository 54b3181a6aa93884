#include "daemon/radix/eviction_policy.h"

#include "absl/strings/str_cat.h"

namespace hicache {

absl::string_view EvictionPolicyName(EvictionPolicy policy) {
  switch (policy) {
    case EvictionPolicy::kLru:
      return "lru";
    case EvictionPolicy::kLfu:
      return "lfu";
    case EvictionPolicy::kFifo:
      return "fifo";
    case EvictionPolicy::kPriority:
      return "priority";
    case EvictionPolicy::kSlru:
      return "slru";
  }
  return "unknown";
}

absl::StatusOr<EvictionPolicy> ParseEvictionPolicy(absl::string_view name) {
  for (EvictionPolicy p :
       {EvictionPolicy::kLru, EvictionPolicy::kLfu, EvictionPolicy::kFifo,
        EvictionPolicy::kPriority, EvictionPolicy::kSlru}) {
    if (EvictionPolicyName(p) == name) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy '", name,
                   "'; expected lru, lfu, fifo, priority or slru"));
}

EvictionKey MakeEvictionKey(EvictionPolicy policy, const EvictionFacts& facts,
                            uint64_t tiebreak) {
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
  }
  return {0, 0, tiebreak};
}

}  // namespace hicache
