// MakeEvictionKey per policy and tier, FrequencyClass, UsesFrequencySketch.
// Smaller keys are evicted first.
#include "daemon/radix/eviction_policy.h"

#include <cstdint>

#include "daemon/core/policies.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

EvictionFacts Facts(int64_t last_access_ns, uint32_t frequency,
                    uint32_t hit_count = 0, int32_t priority = 0,
                    int64_t created_ns = 0) {
  return EvictionFacts{.last_access_ns = last_access_ns,
                       .created_ns = created_ns,
                       .hit_count = hit_count,
                       .priority = priority,
                       .frequency = frequency};
}

TEST(EvictionPolicyTest, OnlyTinyLfuUsesTheSketch) {
  for (EvictionPolicy policy : kEvictionPolicies) {
    EXPECT_EQ(UsesFrequencySketch(policy), policy == EvictionPolicy::kTinyLfu)
        << PolicyName(policy);
  }
}

TEST(EvictionPolicyTest, FrequencyClassSplitsAtTwo) {
  EXPECT_EQ(FrequencyClass(0), 0);
  EXPECT_EQ(FrequencyClass(1), 0);
  EXPECT_EQ(FrequencyClass(2), 1);
  EXPECT_EQ(FrequencyClass(3), 1);
  EXPECT_EQ(FrequencyClass(16), 1);
  EXPECT_EQ(FrequencyClass(UINT32_MAX), 1);
}

// The device tier is the recency window: pure LRU, whatever the sketch says.
TEST(EvictionPolicyTest, TinyLfuDeviceTierIsPureLru) {
  const EvictionKey cold_old = MakeEvictionKey(
      EvictionPolicy::kTinyLfu, Facts(100, 0), 7, EvictionTier::kDevice);
  const EvictionKey hot_old = MakeEvictionKey(
      EvictionPolicy::kTinyLfu, Facts(100, 16, 9), 7, EvictionTier::kDevice);
  const EvictionKey cold_new = MakeEvictionKey(
      EvictionPolicy::kTinyLfu, Facts(200, 0), 3, EvictionTier::kDevice);
  EXPECT_EQ(cold_old, (EvictionKey{100, 0, 7}));
  EXPECT_EQ(hot_old, cold_old);  // Frequency and hits do not matter.
  EXPECT_LT(hot_old, cold_new);  // The older goes first, even if hot.
  // The default tier is the device tier.
  EXPECT_EQ(MakeEvictionKey(EvictionPolicy::kTinyLfu, Facts(100, 16), 7),
            hot_old);
}

// The host tier: a node's age is the tree's pages-inserted clock at its last
// access, and a node seen again (class 1) counts as that many pages younger
// as the reuse credit; the wall clock breaks ties, then the node id.
TEST(EvictionPolicyTest, TinyLfuHostTierOrdersByTickPlusReuseCredit) {
  constexpr int64_t kCredit = 1000;
  auto key = [](int64_t tick, uint32_t f, uint64_t id, int64_t ns = 5) {
    EvictionFacts facts = Facts(ns, f);
    facts.last_access_tick = tick;
    facts.reuse_credit = kCredit;
    return MakeEvictionKey(EvictionPolicy::kTinyLfu, facts, id,
                           EvictionTier::kHost);
  };
  EXPECT_EQ(key(100, 1, 7), (EvictionKey{100, 5, 7}));
  EXPECT_EQ(key(100, 2, 7), (EvictionKey{100 + kCredit, 5, 7}));
  // Within the credit, a recent seen-once node goes before an older node
  // seen again ...
  EXPECT_LT(key(900, 1, 1), key(100, 2, 2));
  EXPECT_LT(key(900, 0, 1), key(100, 2, 2));
  // ... and past it, the node seen again goes first: reuse buys time, not
  // a place forever.
  EXPECT_LT(key(100, 2, 2), key(100 + kCredit + 1, 0, 1));
  // Same class: LRU on the tick; frequencies inside a class do not matter.
  EXPECT_LT(key(100, 0, 9), key(200, 1, 1));
  EXPECT_LT(key(100, 16, 9), key(200, 2, 1));
  EXPECT_EQ(key(100, 2, 5), key(100, 16, 5));
  // Same tick: the wall clock, then the node id.
  EXPECT_LT(key(100, 3, 9, 4), key(100, 3, 1, 6));
  EXPECT_LT(key(100, 3, 4), key(100, 3, 5));
  // Without a credit (no sketch sized), classes only order by tick.
  EvictionFacts no_credit = Facts(5, 16);
  no_credit.last_access_tick = 100;
  EXPECT_EQ(MakeEvictionKey(EvictionPolicy::kTinyLfu, no_credit, 7,
                            EvictionTier::kHost),
            (EvictionKey{100, 5, 7}));
}

// Every other policy orders both tiers the same way, and ignores the
// frequency.
TEST(EvictionPolicyTest, OtherPoliciesIgnoreTheTierAndTheFrequency) {
  const EvictionFacts facts[] = {
      Facts(100, 0, 1, 3, 50),  Facts(100, 9, 1, 3, 50),
      Facts(300, 1, 5, -2, 10), Facts(300, 16, 5, -2, 10),
      Facts(200, 2, 2, 0, 200),
  };
  for (EvictionPolicy policy : kEvictionPolicies) {
    if (policy == EvictionPolicy::kTinyLfu) continue;
    SCOPED_TRACE(PolicyName(policy));
    for (const EvictionFacts& f : facts) {
      EXPECT_EQ(MakeEvictionKey(policy, f, 11, EvictionTier::kDevice),
                MakeEvictionKey(policy, f, 11, EvictionTier::kHost));
      EXPECT_EQ(MakeEvictionKey(policy, f, 11),
                MakeEvictionKey(policy, f, 11, EvictionTier::kHost));
    }
    // Pairs that differ only in frequency get the same key.
    EXPECT_EQ(MakeEvictionKey(policy, facts[0], 1, EvictionTier::kHost),
              MakeEvictionKey(policy, facts[1], 1, EvictionTier::kHost));
    EXPECT_EQ(MakeEvictionKey(policy, facts[2], 1, EvictionTier::kHost),
              MakeEvictionKey(policy, facts[3], 1, EvictionTier::kHost));
  }
  // LRU on the host tier: the older goes first whatever its frequency.
  EXPECT_LT(MakeEvictionKey(EvictionPolicy::kLru, Facts(100, 16), 1,
                            EvictionTier::kHost),
            MakeEvictionKey(EvictionPolicy::kLru, Facts(200, 0), 2,
                            EvictionTier::kHost));
}

}  // namespace
}  // namespace hicache
