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

// The host tier: class 0 (seen at most once) before class 1 (seen again),
// LRU inside each class.
TEST(EvictionPolicyTest, TinyLfuHostTierOrdersByClassThenLru) {
  auto key = [](int64_t t, uint32_t f, uint64_t id) {
    return MakeEvictionKey(EvictionPolicy::kTinyLfu, Facts(t, f), id,
                           EvictionTier::kHost);
  };
  EXPECT_EQ(key(100, 1, 7), (EvictionKey{0, 100, 7}));
  EXPECT_EQ(key(100, 2, 7), (EvictionKey{1, 100, 7}));
  // A recent class-0 node goes before an old class-1 node.
  EXPECT_LT(key(900, 1, 1), key(100, 2, 2));
  EXPECT_LT(key(900, 0, 1), key(100, 2, 2));
  // Same class: LRU; frequencies inside a class do not matter.
  EXPECT_LT(key(100, 0, 9), key(200, 1, 1));
  EXPECT_LT(key(100, 16, 9), key(200, 2, 1));
  EXPECT_EQ(key(100, 2, 5), key(100, 16, 5));
  // Full tie: the node id.
  EXPECT_LT(key(100, 3, 4), key(100, 3, 5));
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
