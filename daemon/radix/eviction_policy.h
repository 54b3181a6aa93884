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
  // Accesses of the node's first page in the frequency sketch's window
  // (misses included, so a node evicted and seen again keeps its history);
  // 0 when the tree keeps no sketch.
  uint32_t frequency = 0;
  // Pages inserted into the tree before the node's last access (its age in
  // cache turnover), and how many more pages a node seen again may outlive
  // one seen once by (kTinyLfu's host tier).
  int64_t last_access_tick = 0;
  int64_t reuse_credit = 0;
};

// kTinyLfu's reuse credit, in cache turnovers: on the host tier a node seen
// again leaves as late as a node seen once whose last access came this many
// times the pools' pages (the sketch's size) of insertions later. Reuse buys
// time, not a place forever: a class that only ever ranked seen-again nodes
// after seen-once ones kept dead conversations for good (bench/replay on the
// matched trace: 31.49% L1+L2 under write_ahead, 32.01% with this credit;
// 1.5 turnovers 31.82%, 3 turnovers 31.52%; docs/eviction.md).
inline constexpr int64_t kReuseCreditTurnovers = 2;

// Which tier a victim leaves: the device tier (to the host tier or gone) or
// the host tier (gone).
enum class EvictionTier { kDevice, kHost };

using EvictionKey = std::tuple<int64_t, int64_t, uint64_t>;

// The sort key of a node under `policy` in `tier`; `tiebreak` (the node id)
// makes the order total and deterministic. Only kTinyLfu orders the tiers
// differently: LRU on device (the recency window); on host, LRU on the
// pages-inserted tick of the last access, a node seen again in the sketch's
// window (FrequencyClass 1) counted reuse_credit ticks younger.
EvictionKey MakeEvictionKey(EvictionPolicy policy, const EvictionFacts& facts,
                            uint64_t tiebreak,
                            EvictionTier tier = EvictionTier::kDevice);

// kTinyLfu's frequency class of a node: 0 (seen at most once: probation) or
// 1 (seen again: protected). Also what write-back admission compares.
int FrequencyClass(uint32_t frequency);

// Whether `policy` needs the tree's frequency sketch.
bool UsesFrequencySketch(EvictionPolicy policy);

}  // namespace hicache
