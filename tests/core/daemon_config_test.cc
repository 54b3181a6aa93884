#include "daemon/core/daemon_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

TEST(DaemonConfigTest, DefaultsAreValid) {
  DaemonConfig config;
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.page_size, 64u);
  EXPECT_EQ(config.backend, BackendKind::kCpu);
}

TEST(DaemonConfigTest, HoldsThePoliciesParsed) {
  DaemonConfig config;
  // The best measured pair (docs/eviction.md).
  EXPECT_EQ(config.write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(config.eviction_policy, EvictionPolicy::kTinyLfu);
  EXPECT_EQ(config.host_bytes_per_rank, 0u);  // Sized by pages.
  config.write_policy = static_cast<WritePolicy>(7);
  EXPECT_THAT(config.Validate().message(), HasSubstr("not a policy"));
  config.write_policy = WritePolicy::kWriteBack;
  config.eviction_policy = static_cast<EvictionPolicy>(7);
  EXPECT_THAT(config.Validate().message(), HasSubstr("not a policy"));
}

TEST(DaemonConfigTest, PageSizeMustBePowerOfTwo) {
  DaemonConfig config;
  for (uint32_t ok : {1u, 2u, 16u, 64u, 4096u, 65536u}) {
    config.page_size = ok;
    EXPECT_TRUE(config.Validate().ok()) << ok;
  }
  for (uint32_t bad : {0u, 3u, 48u, 100u, 131072u}) {
    config.page_size = bad;
    absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("page_size"));
    EXPECT_THAT(status.message(), HasSubstr(std::to_string(bad)));
  }
}

TEST(DaemonConfigTest, CpSizeBounds) {
  DaemonConfig config;
  config.cp_size = 0;
  EXPECT_THAT(config.Validate().message(), HasSubstr("cp_size"));
  config.cp_size = DaemonConfig::kMaxCpSize + 1;
  EXPECT_EQ(config.Validate().code(), absl::StatusCode::kInvalidArgument);
  config.cp_size = 8;
  EXPECT_TRUE(config.Validate().ok());
}

TEST(DaemonConfigTest, ServedRanksMustBeAscendingAndInRange) {
  DaemonConfig config;
  config.cp_size = 4;
  config.served_ranks = {1, 3};
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.EffectiveRanks(), (std::vector<uint32_t>{1, 3}));

  config.served_ranks = {1, 4};
  EXPECT_THAT(config.Validate().message(), HasSubstr("served_ranks[1] = 4"));
  config.served_ranks = {2, 2};
  EXPECT_THAT(config.Validate().message(), HasSubstr("duplicates"));
  config.served_ranks = {3, 1};
  EXPECT_EQ(config.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DaemonConfigTest, EmptyServedRanksMeansAll) {
  DaemonConfig config;
  config.cp_size = 3;
  EXPECT_EQ(config.EffectiveRanks(), (std::vector<uint32_t>{0, 1, 2}));
}

TEST(DaemonConfigTest, PoolSizes) {
  DaemonConfig config;
  config.device_pages_per_rank = 1;
  EXPECT_THAT(config.Validate().message(), HasSubstr("padding"));
  config.device_pages_per_rank = 2;
  config.host_pages_per_rank = 0;  // L1-only is allowed.
  EXPECT_TRUE(config.Validate().ok());
  config.host_pages_per_rank = DaemonConfig::kMaxPagesPerRank + 1;
  EXPECT_THAT(config.Validate().message(), HasSubstr("host_pages_per_rank"));
}

TEST(DaemonConfigTest, TcpNeedsTlsUnlessTesting) {
  DaemonConfig config;
  config.listen_tcp = "127.0.0.1:7000";
  EXPECT_THAT(config.Validate().message(), HasSubstr("needs TLS"));
  config.insecure_tcp_for_testing = true;
  EXPECT_TRUE(config.Validate().ok());
  config.insecure_tcp_for_testing = false;
  config.tls_cert_file = "cert.pem";
  EXPECT_THAT(config.Validate().message(), HasSubstr("go together"));
  config.tls_key_file = "key.pem";
  EXPECT_TRUE(config.Validate().ok());
  config.listen_tcp = "7000";
  EXPECT_THAT(config.Validate().message(), HasSubstr("host:port"));
}

TEST(DaemonConfigTest, LogicalDevicePages) {
  DaemonConfig config;
  config.cp_size = 4;
  config.device_pages_per_rank = 1000;
  EXPECT_EQ(config.LogicalDevicePages(), 4000u);
}

TEST(DaemonConfigTest, BackendNamesRoundTrip) {
  for (BackendKind b : {BackendKind::kCpu, BackendKind::kCuda}) {
    absl::StatusOr<BackendKind> parsed = ParseBackend(BackendName(b));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, b);
  }
  EXPECT_EQ(*ParseBackend("CPU"), BackendKind::kCpu);
  absl::StatusOr<BackendKind> bad = ParseBackend("gpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'gpu'"));
}

TEST(DaemonConfigTest, HostLayoutNamesRoundTrip) {
  for (HostLayout l : {HostLayout::kLayerFirst, HostLayout::kPageFirst}) {
    absl::StatusOr<HostLayout> parsed = ParseHostLayout(HostLayoutName(l));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, l);
  }
  EXPECT_FALSE(ParseHostLayout("row_major").ok());
}

TEST(DaemonConfigTest, AbslFlagMarshalling) {
  BackendKind backend = BackendKind::kCpu;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("cuda", &backend, &error));
  EXPECT_EQ(backend, BackendKind::kCuda);
  EXPECT_FALSE(AbslParseFlag("tpu", &backend, &error));
  EXPECT_THAT(error, HasSubstr("expected 'cpu' or 'cuda'"));
  EXPECT_EQ(backend, BackendKind::kCuda);  // Unchanged on failure.
  EXPECT_EQ(AbslUnparseFlag(BackendKind::kCpu), "cpu");

  HostLayout layout = HostLayout::kLayerFirst;
  EXPECT_TRUE(AbslParseFlag("page_first", &layout, &error));
  EXPECT_EQ(layout, HostLayout::kPageFirst);
  EXPECT_EQ(AbslUnparseFlag(layout), "page_first");
}

TEST(DaemonConfigTest, InstanceIdValidation) {
  for (const char* ok : {"a", "hicached-3fa2b1c09d4e", "Node_7-gpu0",
                         "x123456789012345678901234567890123456789012345678901"
                         "234567890123"}) {
    EXPECT_TRUE(IsValidInstanceId(ok)) << ok;
    DaemonConfig config;
    config.instance = ok;
    EXPECT_TRUE(config.Validate().ok()) << ok;
  }
  for (const char* bad :
       {"", "1234", "-a", "_a", "a/b", "a.b", "a b", "../etc", "a\n",
        "x1234567890123456789012345678901234567890123456789012345678901234"}) {
    EXPECT_FALSE(IsValidInstanceId(bad)) << bad;
  }
  DaemonConfig config;
  config.instance = "a/b";
  absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("instance"));
  EXPECT_THAT(status.message(), HasSubstr("'a/b'"));
  config.instance = "";  // Derived from the socket path.
  EXPECT_TRUE(config.Validate().ok());
}

TEST(DaemonConfigTest, DefaultInstanceIdIsStableValidAndPathSpecific) {
  const std::string id = DefaultInstanceId("/run/hicache/hicached.sock");
  EXPECT_EQ(id, DefaultInstanceId("/run/hicache/hicached.sock"));
  EXPECT_TRUE(IsValidInstanceId(id)) << id;
  EXPECT_THAT(id, ::testing::MatchesRegex("hicached-[0-9a-f]{12}"));
  // The same file name in another directory is another instance.
  EXPECT_NE(id, DefaultInstanceId("/tmp/hicached.sock"));
  EXPECT_NE(DefaultInstanceId("/tmp/a.sock"), DefaultInstanceId("/tmp/b.sock"));
  // Odd names are reduced to valid ids.
  for (const char* path : {"/tmp/7.sock", "/tmp/.sock", "/tmp/sp ace.sock",
                           "/", "/tmp/-x", "/tmp/\xff\xfe"}) {
    EXPECT_TRUE(IsValidInstanceId(DefaultInstanceId(path)))
        << path << " -> " << DefaultInstanceId(path);
  }
  EXPECT_THAT(DefaultInstanceId("/tmp/sp ace.sock"),
              ::testing::StartsWith("sp_ace-"));
  EXPECT_TRUE(IsValidInstanceId(DefaultInstanceId(
      "/tmp/" + std::string(300, 'n') + ".sock")));
}

TEST(DaemonConfigTest, MetricsAddressIsAnIpLiteralAndAPort) {
  for (const char* good : {"127.0.0.1:9464", "0.0.0.0:9464", "127.0.0.1:0",
                           "10.1.2.3:65535"}) {
    EXPECT_TRUE(CheckMetricsAddress(good).ok()) << good;
    DaemonConfig config;
    config.metrics_address = good;
    EXPECT_TRUE(config.Validate().ok()) << good;
  }
  for (const char* bad :
       {"localhost:9464", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536",
        "127.0.0.1:-1", "127.0.0.1:9464s", "127.0.0.1:0x10", ":9464", "9464",
        "[::1:9464", "::1:9464", "1.2.3:9464", "127.0.0.1:9464,8080",
        "127.0.0.1:123456", "[127.0.0.1]:9464",
        // No IPv6: the HTTP server under prometheus-cpp is built without it.
        "[::1]:9464", "[::]:0"}) {
    absl::Status status = CheckMetricsAddress(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("metrics_address")) << bad;
    EXPECT_THAT(status.message(), HasSubstr(bad)) << bad;
    DaemonConfig config;
    config.metrics_address = bad;
    EXPECT_EQ(config.Validate().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  DaemonConfig off;  // Empty: no endpoint, valid.
  EXPECT_TRUE(off.Validate().ok());
}

}  // namespace
}  // namespace hicache
