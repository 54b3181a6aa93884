#include "daemon/core/policies.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hicache {
namespace {

// "a, b or c".
template <typename Policy, size_t N>
std::string NameList(const std::array<Policy, N>& all) {
  std::vector<absl::string_view> names;
  for (Policy p : all) names.push_back(PolicyName(p));
  const absl::string_view last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

template <typename Policy, size_t N>
absl::StatusOr<Policy> Parse(absl::string_view name, absl::string_view what,
                             const std::array<Policy, N>& all) {
  for (Policy p : all) {
    if (PolicyName(p) == name) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown ", what, " '", name, "'; expected ", NameList(all)));
}

template <typename Policy>
bool ParseFlag(absl::string_view text, Policy* policy, std::string* error) {
  absl::StatusOr<Policy> parsed = ParsePolicy<Policy>(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *policy = *parsed;
  return true;
}

}  // namespace

absl::string_view PolicyName(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::kWriteThrough:
      return "write_through";
    case WritePolicy::kWriteThroughSelective:
      return "write_through_selective";
    case WritePolicy::kWriteBack:
      return "write_back";
    case WritePolicy::kWriteAhead:
      return "write_ahead";
  }
  return "unknown";
}

absl::string_view PolicyName(EvictionPolicy policy) {
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
    case EvictionPolicy::kTinyLfu:
      return "tinylfu";
  }
  return "unknown";
}

absl::string_view PolicyName(PrefetchPolicy policy) {
  switch (policy) {
    case PrefetchPolicy::kWaitComplete:
      return "wait_complete";
    case PrefetchPolicy::kBestEffort:
      return "best_effort";
    case PrefetchPolicy::kTimeout:
      return "timeout";
  }
  return "unknown";
}

template <>
absl::StatusOr<PrefetchPolicy> ParsePolicy<PrefetchPolicy>(
    absl::string_view name) {
  return Parse(name, "prefetch policy", kPrefetchPolicies);
}

bool AbslParseFlag(absl::string_view text, PrefetchPolicy* policy,
                   std::string* error) {
  return ParseFlag(text, policy, error);
}

std::string AbslUnparseFlag(PrefetchPolicy policy) {
  return std::string(PolicyName(policy));
}

template <>
absl::StatusOr<WritePolicy> ParsePolicy<WritePolicy>(absl::string_view name) {
  return Parse(name, "write policy", kWritePolicies);
}

template <>
absl::StatusOr<EvictionPolicy> ParsePolicy<EvictionPolicy>(
    absl::string_view name) {
  return Parse(name, "eviction policy", kEvictionPolicies);
}

bool AbslParseFlag(absl::string_view text, WritePolicy* policy,
                   std::string* error) {
  return ParseFlag(text, policy, error);
}

std::string AbslUnparseFlag(WritePolicy policy) {
  return std::string(PolicyName(policy));
}

bool AbslParseFlag(absl::string_view text, EvictionPolicy* policy,
                   std::string* error) {
  return ParseFlag(text, policy, error);
}

std::string AbslUnparseFlag(EvictionPolicy policy) {
  return std::string(PolicyName(policy));
}

}  // namespace hicache
