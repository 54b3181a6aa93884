// NamespaceQuota: the --namespace_quotas entry format and its checks, alone
// and in a DaemonConfig (docs/quotas.md).
#include "daemon/core/namespace_quota.h"

#include <limits>

#include "daemon/core/daemon_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

TEST(NamespaceQuotaTest, ParsesEntriesAndFormatsThemBack) {
  absl::StatusOr<NamespaceQuota> q = ParseNamespaceQuota(
      "tenant-a:device_limit=4096,host_guaranteed=100");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, (NamespaceQuota{.ns = "tenant-a",
                                .device_limit = 4096,
                                .host_guaranteed = 100}));
  EXPECT_EQ(FormatNamespaceQuota(*q),
            "tenant-a:device_limit=4096,host_guaranteed=100");
  // The namespace is everything before the last ':' (it may hold ':' or be
  // empty, the default namespace).
  q = ParseNamespaceQuota("lora:7:device_guaranteed=3");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->ns, "lora:7");
  q = ParseNamespaceQuota(":host_limit=9");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, (NamespaceQuota{.ns = "", .host_limit = 9}));
  EXPECT_EQ(ParseNamespaceQuota(FormatNamespaceQuota(*q)).value(), *q);
}

TEST(NamespaceQuotaTest, RefusesWhatIsNotAQuota) {
  for (const char* bad : {"tenant-a", "tenant-a:", "a:device_limit",
                          "a:device_limit=x", "a:colour=3",
                          "a:device_limit=-1", "a:host_limit=4,host_guaranteed=5",
                          "a:device_limit=99999999999999999999"}) {
    absl::StatusOr<NamespaceQuota> q = ParseNamespaceQuota(bad);
    EXPECT_EQ(q.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ParseNamespaceQuota("a:colour=3").status().message(),
              HasSubstr("unknown key 'colour'"));
}

TEST(NamespaceQuotaTest, ADaemonConfigChecksItsQuotasTogether) {
  DaemonConfig config;  // 4095 usable device pages, 16384 host pages.
  config.namespace_quotas = {{.ns = "a", .device_guaranteed = 4000}};
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  config.namespace_quotas.push_back({.ns = "b", .device_guaranteed = 96});
  EXPECT_THAT(config.Validate().message(), HasSubstr("exceed the pools"));
  config.namespace_quotas.back() = {.ns = "a", .host_limit = 1};
  EXPECT_THAT(config.Validate().message(), HasSubstr("two quotas"));
  // Reproduction: a huge guarantee summed with another overflowed.
  config.namespace_quotas.back() = {
      .ns = "b", .device_guaranteed = std::numeric_limits<int64_t>::max()};
  EXPECT_THAT(config.Validate().message(), HasSubstr("exceed the pools"));
  config.namespace_quotas = {{.ns = "a", .device_limit = -1}};
  EXPECT_EQ(config.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hicache
