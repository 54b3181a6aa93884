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

TEST(DaemonConfigTest, JournalSettleIsBounded) {
  DaemonConfig config;
  EXPECT_EQ(config.journal_settle_ms, 20);
  for (int ms : {0, 50, 10000}) {
    config.journal_settle_ms = ms;
    EXPECT_TRUE(config.Validate().ok()) << ms;
  }
  for (int ms : {-1, 10001}) {
    config.journal_settle_ms = ms;
    const absl::Status status = config.Validate();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << ms;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr("journal_settle_ms"));
  }
}

// The storage tier's settings (--l3_*): each bad value is refused with the
// flag's name; a daemon holding only some ranks has no storage tier.
TEST(DaemonConfigTest, StorageSettingsAreChecked) {
  DaemonConfig config;
  config.storage.dir = "/var/lib/hicache/l3";
  config.storage.pages_per_rank = 1024;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  auto refused = [](const DaemonConfig& c, const std::string& what) {
    const absl::Status status = c.Validate();
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << what;
    EXPECT_THAT(std::string(status.message()), HasSubstr(what));
  };
  DaemonConfig c = config;
  c.storage.dir = "relative/l3";
  refused(c, "l3_dir must be an absolute path");
  c = config;
  c.storage.pages_per_rank = 0;
  refused(c, "l3_pages");
  c = config;
  c.storage.redis_address = "127.0.0.1:6379";
  refused(c, "exclusive");
  c = config;
  c.storage.io = "aio";
  refused(c, "l3_io");
  c = config;
  c.storage.queue_depth = 4097;
  refused(c, "l3_queue_depth");
  c = config;
  c.storage_recompute_ns_per_token = -1;
  refused(c, "l3_recompute_ns_per_token");
  c = config;
  c.storage_prefetch_timeout_ms = 60001;
  refused(c, "l3_prefetch_timeout_ms");
  c = config;
  c.cp_size = 2;
  c.served_ranks = {1};
  refused(c, "every rank served by this daemon");
  c = DaemonConfig();
  c.cp_size = 2;
  c.served_ranks = {0};
  c.storage.redis_address = "127.0.0.1:6379";
  refused(c, "every rank served by this daemon");
}

TEST(DaemonConfigTest, HoldsThePoliciesParsed) {
  DaemonConfig config;
  // The default pair (docs/eviction.md): a prefix-closed host tier that
  // survives a crash, TinyLFU on the host tier.
  EXPECT_EQ(config.write_policy, WritePolicy::kWriteAhead);
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

// A CP group leader as hicached builds it: cp_size >= 2, listen_tcp, its own
// pool ranks.
DaemonConfig CpGroupLeader() {
  DaemonConfig config;
  config.cp_size = 2;
  config.served_ranks = {0};
  config.listen_tcp = "127.0.0.1:0";
  config.insecure_tcp_for_testing = true;
  config.cp_group.name = "g";
  return config;
}

DaemonConfig CpGroupFollower() {
  DaemonConfig config;
  config.cp_size = 2;
  config.served_ranks = {1};
  config.cp_group.name = "g";
  config.cp_group.leader = "127.0.0.1:7000";
  config.cp_group.member = "f1";
  return config;
}

TEST(DaemonConfigTest, ValidCpGroupLeaderAndFollowerPass) {
  DaemonConfig leader = CpGroupLeader();
  EXPECT_TRUE(leader.Validate().ok()) << leader.Validate();
  EXPECT_TRUE(leader.cp_group.is_leader());
  leader.served_ranks.clear();  // Holds every pool itself: still a leader.
  EXPECT_TRUE(leader.Validate().ok()) << leader.Validate();

  DaemonConfig follower = CpGroupFollower();
  EXPECT_TRUE(follower.Validate().ok()) << follower.Validate();
  EXPECT_FALSE(follower.cp_group.is_leader());
  // A follower needs no TCP listener of its own.
  EXPECT_TRUE(follower.listen_tcp.empty());

  DaemonConfig four = CpGroupFollower();
  four.cp_size = 4;
  four.served_ranks = {2, 3};
  EXPECT_TRUE(four.Validate().ok()) << four.Validate();
}

TEST(DaemonConfigTest, CpGroupSettingsAreValidatedThroughTheDaemonConfig) {
  DaemonConfig config = CpGroupFollower();
  config.cp_group.leader = "no-port";
  absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("cp_group_leader"));

  DaemonConfig stray;  // No group, but a leader target.
  stray.cp_group.leader = "127.0.0.1:7000";
  EXPECT_THAT(stray.Validate().message(), HasSubstr("need cp_group"));
}

TEST(DaemonConfigTest, CpGroupNeedsAtLeastTwoRanks) {
  for (DaemonConfig config : {CpGroupLeader(), CpGroupFollower()}) {
    config.cp_size = 1;
    config.served_ranks = {0};
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("cp_group needs cp_size >= 2"));
    EXPECT_THAT(status.message(), HasSubstr("got 1"));
  }
  // Without a group, cp_size 1 is the ordinary default.
  DaemonConfig plain;
  plain.cp_size = 1;
  EXPECT_TRUE(plain.Validate().ok());
}

TEST(DaemonConfigTest, CpGroupLeaderNeedsListenTcp) {
  DaemonConfig config = CpGroupLeader();
  config.listen_tcp.clear();
  const absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("needs listen_tcp"));
  // A follower's missing listener is fine (see above); a leader's listener
  // still needs TLS or the testing flag.
  config.listen_tcp = "127.0.0.1:0";
  config.insecure_tcp_for_testing = false;
  EXPECT_THAT(config.Validate().message(), HasSubstr("needs TLS"));
}

TEST(DaemonConfigTest, CpGroupFollowerNeedsRanks) {
  DaemonConfig config = CpGroupFollower();
  config.served_ranks.clear();
  const absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("follower needs ranks"));
  // Out-of-range ranks are refused by the general rule first.
  config.served_ranks = {2};
  EXPECT_THAT(config.Validate().message(), HasSubstr("served_ranks[0] = 2"));
}

TEST(DaemonConfigTest, CpGroupRefusesStateDirAndSaysHowToTurnItOff) {
  DaemonConfig leader = CpGroupLeader();
  leader.served_ranks.clear();  // Every rank: past the partial-ranks rule.
  leader.state_dir = "/var/lib/hicache";
  absl::Status status = leader.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("state_dir does not work with "
                                          "cp_group"));
  EXPECT_THAT(status.message(), HasSubstr("--state_dir="));

  // A daemon holding only some ranks is refused by the older rule (which
  // names the multi-daemon CP group but not the flag to clear).
  for (DaemonConfig config : {CpGroupLeader(), CpGroupFollower()}) {
    config.state_dir = "/var/lib/hicache";
    status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("state_dir"));
    config.state_dir.clear();
    EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  }
}

}  // namespace
}  // namespace hicache
