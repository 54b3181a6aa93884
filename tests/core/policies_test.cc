#include "daemon/core/policies.h"

#include <sstream>
#include <string>

#include "absl/flags/marshalling.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The names are the flags' values and what GetStats reports: they must not
// change.
TEST(PoliciesTest, NamesAreTheFlagValues) {
  std::vector<std::string> write, eviction;
  for (WritePolicy p : kWritePolicies) write.emplace_back(PolicyName(p));
  for (EvictionPolicy p : kEvictionPolicies) {
    eviction.emplace_back(PolicyName(p));
  }
  EXPECT_THAT(write, ElementsAre("write_through", "write_through_selective",
                                 "write_back", "write_ahead"));
  EXPECT_THAT(eviction, ElementsAre("lru", "lfu", "fifo", "priority", "slru", "tinylfu"));
  EXPECT_EQ(PolicyName(static_cast<WritePolicy>(99)), "unknown");
  EXPECT_EQ(PolicyName(static_cast<EvictionPolicy>(99)), "unknown");
}

TEST(PoliciesTest, ParseIsTheInverseOfName) {
  for (WritePolicy p : kWritePolicies) {
    EXPECT_EQ(*ParsePolicy<WritePolicy>(PolicyName(p)), p);
  }
  for (EvictionPolicy p : kEvictionPolicies) {
    EXPECT_EQ(*ParsePolicy<EvictionPolicy>(PolicyName(p)), p);
  }
}

TEST(PoliciesTest, UnknownNamesListTheValidOnes) {
  absl::StatusOr<WritePolicy> write =
      ParsePolicy<WritePolicy>("write_sideways");
  EXPECT_EQ(write.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(write.status().message(),
            "unknown write policy 'write_sideways'; expected write_through, "
            "write_through_selective, write_back or write_ahead");
  absl::StatusOr<EvictionPolicy> eviction = ParsePolicy<EvictionPolicy>("LRU");
  EXPECT_EQ(eviction.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(eviction.status().message(),
            "unknown eviction policy 'LRU'; expected lru, lfu, fifo, priority, "
            "slru or tinylfu");
  EXPECT_FALSE(ParsePolicy<WritePolicy>("").ok());
}

TEST(PoliciesTest, FlagsParseAndUnparse) {
  WritePolicy write = WritePolicy::kWriteThrough;
  std::string error;
  EXPECT_TRUE(absl::ParseFlag("write_back", &write, &error));
  EXPECT_EQ(write, WritePolicy::kWriteBack);
  EXPECT_EQ(absl::UnparseFlag(write), "write_back");
  EXPECT_FALSE(absl::ParseFlag("back", &write, &error));
  EXPECT_THAT(error, HasSubstr("unknown write policy 'back'"));
  EXPECT_EQ(write, WritePolicy::kWriteBack);  // Unchanged on error.

  EvictionPolicy eviction = EvictionPolicy::kLru;
  EXPECT_TRUE(absl::ParseFlag("slru", &eviction, &error));
  EXPECT_EQ(eviction, EvictionPolicy::kSlru);
  EXPECT_EQ(absl::UnparseFlag(eviction), "slru");
  EXPECT_FALSE(absl::ParseFlag("mru", &eviction, &error));
  EXPECT_THAT(error, HasSubstr("expected lru, lfu"));
}

TEST(PoliciesTest, NamedPolicyIsTheEnumAndReadsAsItsName) {
  NamedPolicy<WritePolicy> policy = WritePolicy::kWriteBack;
  EXPECT_EQ(policy, WritePolicy::kWriteBack);
  EXPECT_NE(policy, WritePolicy::kWriteThrough);
  const WritePolicy bare = policy;
  EXPECT_EQ(bare, WritePolicy::kWriteBack);
  EXPECT_EQ(policy.value(), WritePolicy::kWriteBack);
  EXPECT_EQ(policy.name(), "write_back");
  const std::string name = policy;  // What GetStats reports.
  EXPECT_EQ(name, "write_back");
  policy = WritePolicy::kWriteThrough;
  switch (policy) {
    case WritePolicy::kWriteThrough:
      break;
    default:
      ADD_FAILURE() << "switch saw " << policy;
  }
  std::ostringstream out;
  out << NamedPolicy<EvictionPolicy>(EvictionPolicy::kFifo) << " "
      << WritePolicy::kWriteThroughSelective;
  EXPECT_EQ(out.str(), "fifo write_through_selective");
}

}  // namespace
}  // namespace hicache
