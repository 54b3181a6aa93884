#pragma once

// The engine's policies as configuration vocabulary: one enum each, its flag
// names, and their parsing. Every layer (flags, DaemonConfig, engine, tree,
// tools) names a policy with these; nothing else maps names to policies.

#include <array>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache {

// When device KV is copied to the host pool.
enum class WritePolicy {
  kWriteThrough,           // At the first hit of a device node.
  kWriteThroughSelective,  // When a node's hit count reaches the threshold.
  kWriteBack,              // When a device node is evicted.
  kWriteAhead,             // Ahead of eviction, in the background: the cold
                           // end of the device tier is copied before room is
                           // needed; eviction never waits for a copy (a
                           // victim without one is dropped), and every host
                           // copy has copies of its ancestors (prefix-closed,
                           // so a restart recovers it). docs/eviction.md.
};

// Order in which eviction picks victims among eligible leaves.
enum class EvictionPolicy {
  kLru,       // Least recently accessed first.
  kLfu,       // Fewest hits first, then least recently accessed.
  kFifo,      // Oldest created first.
  kPriority,  // Lowest priority first, then least recently accessed.
  kSlru,      // Segmented LRU: nodes hit once (probation) before nodes hit
              // again (protected segment); LRU inside each segment.
  kTinyLfu,   // Window TinyLFU across the tiers: the device tier is an LRU
              // window; the host tier evicts the learned unshared ends of
              // requests first, then what a frequency sketch of recent
              // accesses (misses included) saw once, then what it saw again,
              // LRU inside each; under write_back a device victim is demoted
              // to the host tier only if that would not displace a more
              // frequent host node (admission). docs/eviction.md.
};

// Every value, in declaration order (tests, help texts).
// How a load waits for the pages the storage tier (L3) holds past the
// tree's hit (docs/storage-tier.md §1), SGLang's prefetch policies.
enum class PrefetchPolicy {
  kWaitComplete,  // The load reads them first, however long that takes.
  kBestEffort,    // The reads start in the background; the load does not
                  // wait (a later load finds them in the host tier).
  kTimeout,       // As kBestEffort, but the load waits up to a timeout.
};

inline constexpr std::array<PrefetchPolicy, 3> kPrefetchPolicies = {
    PrefetchPolicy::kWaitComplete, PrefetchPolicy::kBestEffort,
    PrefetchPolicy::kTimeout};

inline constexpr std::array<WritePolicy, 4> kWritePolicies = {
    WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective,
    WritePolicy::kWriteBack, WritePolicy::kWriteAhead};
inline constexpr std::array<EvictionPolicy, 6> kEvictionPolicies = {
    EvictionPolicy::kLru,      EvictionPolicy::kLfu,  EvictionPolicy::kFifo,
    EvictionPolicy::kPriority, EvictionPolicy::kSlru, EvictionPolicy::kTinyLfu};

// The flag name: "write_through", "write_through_selective", "write_back",
// "write_ahead";
// "lru", "lfu", "fifo", "priority", "slru", "tinylfu". These are also what GetStats
// reports. "unknown" for a value outside the enum.
absl::string_view PolicyName(WritePolicy policy);
absl::string_view PolicyName(EvictionPolicy policy);
absl::string_view PolicyName(PrefetchPolicy policy);

// The inverse of PolicyName (exact, case-sensitive), or INVALID_ARGUMENT
// "unknown write policy 'x'; expected write_through, write_through_selective
// or write_back" (likewise "unknown eviction policy"). Defined for
// WritePolicy and EvictionPolicy only.
template <typename Policy>
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);
template <>
absl::StatusOr<WritePolicy> ParsePolicy<WritePolicy>(absl::string_view name);
template <>
absl::StatusOr<EvictionPolicy> ParsePolicy<EvictionPolicy>(
    absl::string_view name);
template <>
absl::StatusOr<PrefetchPolicy> ParsePolicy<PrefetchPolicy>(
    absl::string_view name);
bool AbslParseFlag(absl::string_view text, PrefetchPolicy* policy,
                   std::string* error);
std::string AbslUnparseFlag(PrefetchPolicy policy);

// Abseil flag marshalling, so --write_policy=x fails at flag parsing with the
// list of valid values.
bool AbslParseFlag(absl::string_view text, WritePolicy* policy,
                   std::string* error);
std::string AbslUnparseFlag(WritePolicy policy);
bool AbslParseFlag(absl::string_view text, EvictionPolicy* policy,
                   std::string* error);
std::string AbslUnparseFlag(EvictionPolicy policy);

inline std::ostream& operator<<(std::ostream& os, WritePolicy policy) {
  return os << PolicyName(policy);
}
inline std::ostream& operator<<(std::ostream& os, EvictionPolicy policy) {
  return os << PolicyName(policy);
}

// A policy as DaemonConfig holds it: the enum, parsed once (at flag parsing).
// Converts implicitly to and from the enum, so it is used as one (compare,
// switch, assign, designated initializers).
//
// It also converts to its name as a std::string, so that code which reported
// the configuration's former string field (`settings.set_write_policy(
// config.write_policy)` in daemon/service) reports the same text. That
// conversion is transitional: once no caller relies on it, DaemonConfig holds
// the bare enums and this class goes.
template <typename Policy>
class NamedPolicy {
 public:
  constexpr NamedPolicy(Policy policy) : policy_(policy) {}  // NOLINT
  constexpr operator Policy() const { return policy_; }      // NOLINT
  operator std::string() const {                             // NOLINT
    return std::string(PolicyName(policy_));
  }

  constexpr Policy value() const { return policy_; }
  absl::string_view name() const { return PolicyName(policy_); }

  friend std::ostream& operator<<(std::ostream& os, NamedPolicy policy) {
    return os << policy.name();
  }

 private:
  Policy policy_;
};

}  // namespace hicache
