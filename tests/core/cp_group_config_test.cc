// CpGroupConfig::Validate: every rule, with the field named in the message
// and hostile values C-escaped there.
#include "daemon/core/cp_group_config.h"

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

CpGroupConfig Leader() {
  CpGroupConfig config;
  config.name = "g1";
  return config;
}

CpGroupConfig Follower() {
  CpGroupConfig config;
  config.name = "g1";
  config.leader = "10.0.0.1:7000";
  config.member = "node-2";
  return config;
}

void ExpectInvalid(const CpGroupConfig& config, const std::string& field) {
  const absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_THAT(status.message(), HasSubstr(field));
}

TEST(CpGroupConfigTest, DefaultsAreDisabledAndValid) {
  CpGroupConfig config;
  EXPECT_FALSE(config.enabled());
  EXPECT_FALSE(config.is_leader());
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.bind, "127.0.0.1");
  EXPECT_EQ(config.heartbeat_ms, 100u);
  EXPECT_EQ(config.timeout_ms, 1000u);
  EXPECT_EQ(config.join_timeout_ms, 60000u);
  EXPECT_EQ(config.step_timeout_ms, 10000u);
  EXPECT_EQ(config.digest_interval_ms, 1000u);
  // Settings that only matter in a group are not checked without one.
  config.heartbeat_ms = 0;
  config.timeout_ms = 0;
  config.join_timeout_ms = 0;
  config.bind = "";
  EXPECT_TRUE(config.Validate().ok());
}

TEST(CpGroupConfigTest, RolesFollowNameAndLeader) {
  CpGroupConfig leader = Leader();
  EXPECT_TRUE(leader.enabled());
  EXPECT_TRUE(leader.is_leader());
  EXPECT_TRUE(leader.Validate().ok()) << leader.Validate();

  CpGroupConfig follower = Follower();
  EXPECT_TRUE(follower.enabled());
  EXPECT_FALSE(follower.is_leader());
  EXPECT_TRUE(follower.Validate().ok()) << follower.Validate();

  // A leader with an advertised target and a member name.
  leader.advertise = "leader.example:7000";
  leader.member = "lead_0.a";
  EXPECT_TRUE(leader.Validate().ok()) << leader.Validate();
}

TEST(CpGroupConfigTest, DisabledGroupRefusesStrayGroupSettings) {
  for (int field = 0; field < 3; ++field) {
    CpGroupConfig config;
    if (field == 0) config.leader = "10.0.0.1:7000";
    if (field == 1) config.advertise = "10.0.0.1:7000";
    if (field == 2) config.member = "m";
    const absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(status.message(), HasSubstr("need cp_group")) << field;
    EXPECT_FALSE(config.enabled());
    EXPECT_FALSE(config.is_leader());
  }
}

TEST(CpGroupConfigTest, NamesAreShortPortableCharacters) {
  for (const std::string& ok :
       {std::string("a"), std::string("A-z_0.9"), std::string(128, 'n')}) {
    CpGroupConfig config = Follower();
    config.name = ok;
    config.member = ok;
    EXPECT_TRUE(config.Validate().ok()) << ok << ": " << config.Validate();
  }
  for (const std::string& bad :
       {std::string(129, 'n'), std::string("a/b"), std::string("a b"),
        std::string("a:b"), std::string("a\nb"), std::string("a\0b", 3),
        std::string("caf\xc3\xa9"), std::string("../x"),
        std::string("a*")}) {
    CpGroupConfig name = Follower();
    name.name = bad;
    ExpectInvalid(name, "cp_group must be");
    CpGroupConfig member = Follower();
    member.member = bad;
    ExpectInvalid(member, "cp_group_member");
  }
}

TEST(CpGroupConfigTest, HostileNamesAreEscapedInTheMessage) {
  CpGroupConfig config = Follower();
  config.name = std::string("x\ny\0z\x1b[2J", 9);
  absl::Status status = config.Validate();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'x\\ny\\000z\\033[2J'"));
  EXPECT_THAT(std::string(status.message()), Not(HasSubstr("\n")));
  EXPECT_EQ(std::string(status.message()).find('\0'), std::string::npos);

  config = Follower();
  config.member = "m\tn";
  status = config.Validate();
  EXPECT_THAT(status.message(), HasSubstr("cp_group_member"));
  EXPECT_THAT(status.message(), HasSubstr("'m\\tn'"));

  config = Follower();
  config.leader = "h\rx:1";
  status = config.Validate();
  EXPECT_THAT(status.message(), HasSubstr("cp_group_leader"));
  EXPECT_THAT(status.message(), HasSubstr("'h\\rx:1'"));
}

TEST(CpGroupConfigTest, TargetsAreHostAndPort) {
  for (const char* ok : {"10.0.0.1:7000", "leader:1", "h.example.com:65535",
                         "[::1]:7000", "[fe80::1%eth0]:80"}) {
    CpGroupConfig follower = Follower();
    follower.leader = ok;
    EXPECT_TRUE(follower.Validate().ok()) << ok << ": " << follower.Validate();
    CpGroupConfig leader = Leader();
    leader.advertise = ok;
    EXPECT_TRUE(leader.Validate().ok()) << ok << ": " << leader.Validate();
  }
  const std::string too_long = std::string(252, 'h') + ":7000";  // 257.
  for (const std::string& bad :
       {std::string("leader"), std::string("leader:"), std::string(":7000"),
        std::string("leader:0"), std::string("leader:65536"),
        std::string("leader:99999999999"), std::string("leader:-1"),
        std::string("leader:7000x"), std::string("leader:0x10"),
        std::string("lead er:7000"), std::string("leader\n:7000"),
        std::string("lead\x7f" "er:7000"), std::string("a/b:7000"),
        std::string("unix:/tmp/sock:1"), std::string("lead\0er:7000", 12),
        too_long}) {
    CpGroupConfig follower = Follower();
    follower.leader = bad;
    ExpectInvalid(follower, "cp_group_leader must be the leader's host:port");
    CpGroupConfig leader = Leader();
    leader.advertise = bad;
    ExpectInvalid(leader, "cp_group_advertise must be host:port");
  }
  // 256 characters is the longest target.
  CpGroupConfig longest = Follower();
  longest.leader = std::string(251, 'h') + ":7000";
  EXPECT_TRUE(longest.Validate().ok()) << longest.Validate();
}

TEST(CpGroupConfigTest, BindIsShortAndPresent) {
  CpGroupConfig config = Leader();
  config.bind = "";
  ExpectInvalid(config, "cp_group_bind");
  config.bind = std::string(65, '1');
  ExpectInvalid(config, "cp_group_bind");
  config.bind = "0.0.0.0";
  EXPECT_TRUE(config.Validate().ok());
}

TEST(CpGroupConfigTest, HeartbeatBounds) {
  CpGroupConfig config = Leader();
  config.heartbeat_ms = 0;
  ExpectInvalid(config, "cp_group_heartbeat_ms must be in [1, 60000], got 0");
  config.heartbeat_ms = 60001;
  config.timeout_ms = 600000;
  ExpectInvalid(config, "got 60001");
  config.heartbeat_ms = 60000;
  config.step_timeout_ms = 0;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  config.heartbeat_ms = 1;
  config.timeout_ms = 2;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
}

TEST(CpGroupConfigTest, TimeoutIsAboveHeartbeatAndBounded) {
  CpGroupConfig config = Leader();
  config.timeout_ms = config.heartbeat_ms;  // Equal: refused.
  ExpectInvalid(config, "cp_group_timeout_ms must be above");
  EXPECT_THAT(config.Validate().message(), HasSubstr("(100)"));
  config.timeout_ms = 50;
  ExpectInvalid(config, "got 50");
  config.timeout_ms = 600001;
  ExpectInvalid(config, "cp_group_timeout_ms");
  config.timeout_ms = 600000;
  EXPECT_TRUE(config.Validate().ok());
  config.timeout_ms = 101;
  EXPECT_TRUE(config.Validate().ok());
}

TEST(CpGroupConfigTest, JoinTimeoutIsAtLeastASecond) {
  CpGroupConfig config = Follower();
  config.join_timeout_ms = 999;
  ExpectInvalid(config, "cp_group_join_timeout_ms must be at least 1000, got "
                        "999");
  config.join_timeout_ms = 0;
  ExpectInvalid(config, "cp_group_join_timeout_ms");
  config.join_timeout_ms = 1000;
  EXPECT_TRUE(config.Validate().ok());
  config.join_timeout_ms = UINT32_MAX;
  EXPECT_TRUE(config.Validate().ok());
}

TEST(CpGroupConfigTest, StepTimeoutIsOffOrAboveHeartbeat) {
  CpGroupConfig config = Leader();
  config.step_timeout_ms = 0;  // No deadline.
  EXPECT_TRUE(config.Validate().ok());
  config.step_timeout_ms = config.heartbeat_ms;
  ExpectInvalid(config, "cp_group_step_timeout_ms must be 0 (none) or above");
  config.step_timeout_ms = 1;
  ExpectInvalid(config, "got 1");
  config.step_timeout_ms = config.heartbeat_ms + 1;
  EXPECT_TRUE(config.Validate().ok());
  config.digest_interval_ms = 0;  // Never compare: allowed.
  EXPECT_TRUE(config.Validate().ok());
}

// Reproduction: IsHostPort parsed the port with absl::SimpleAtoi, which
// skips leading and trailing ASCII whitespace, so "leader:7000\n",
// "leader: 7000" and "leader:7000 " passed Validate and a control character
// reached the gRPC target and the redirect trailer (hicache-leader).
TEST(CpGroupConfigTest, WhitespaceAroundThePortIsRefused) {
  for (const char* bad : {"leader:7000\n", "leader: 7000", "leader:7000 ",
                          "leader:\t7000", "leader:7000\r"}) {
    CpGroupConfig follower = Follower();
    follower.leader = bad;
    EXPECT_EQ(follower.Validate().code(), absl::StatusCode::kInvalidArgument)
        << absl::CEscape(bad);
    CpGroupConfig leader = Leader();
    leader.advertise = bad;
    EXPECT_EQ(leader.Validate().code(), absl::StatusCode::kInvalidArgument)
        << absl::CEscape(bad);
  }
}

// The first failing rule wins, and a broken name is reported before the
// targets and the timings.
TEST(CpGroupConfigTest, NameIsCheckedFirst) {
  CpGroupConfig config = Follower();
  config.name = "bad name";
  config.leader = "nope";
  config.heartbeat_ms = 0;
  ExpectInvalid(config, "cp_group must be");
}

}  // namespace
}  // namespace hicache
