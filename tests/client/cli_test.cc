#include "client/ctl/cli.h"

#include <sstream>

#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.pb.h"
#include "tests/testing/temp_dir.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

CliResult Cli(std::vector<std::string> args) {
  std::ostringstream out, err;
  const int code = RunCli(args, out, err);
  return {code, out.str(), err.str()};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.cp_size = 4;
    config.served_ranks = {0, 2};
    auto server = DaemonServer::Start(config, socket_, Clock::Real());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  std::unique_ptr<DaemonServer> server_;
};

TEST_F(CliTest, HealthPrintsServing) {
  CliResult r = Cli({"--socket=" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  r = Cli({"--socket", socket_, "health", "hicache.v1.HiCache"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_EQ(r.out, "SERVING\n");
}

TEST_F(CliTest, HealthOfUnknownServiceFails) {
  CliResult r = Cli({"--socket=" + socket_, "health", "nope.Service"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_EQ(r.out, "SERVICE_UNKNOWN\n");
}

TEST_F(CliTest, HealthJson) {
  CliResult r = Cli({"--json", "--socket=" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("\"status\":\"SERVING\""));
  EXPECT_THAT(r.out, HasSubstr("\"target\":\"unix:" + socket_ + "\""));
}

TEST_F(CliTest, StatsHumanAndJson) {
  CliResult r = Cli({"--socket=" + socket_, "stats"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("cp size:       4 (ranks served: 0,2)"));

  r = Cli({"--socket=" + socket_, "--json", "stats"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &stats).ok())
      << r.out;
  EXPECT_EQ(stats.geometry().cp_size(), 4u);
  EXPECT_EQ(stats.geometry().served_ranks_size(), 2);
  EXPECT_EQ(stats.pid(), getpid());
}

TEST_F(CliTest, TargetOverridesSocket) {
  CliResult r =
      Cli({"--socket=/nonexistent.sock", "--target=unix:" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
}

TEST(CliUsageTest, HelpExitsZeroAndDocumentsExitCodes) {
  for (const char* flag : {"--help", "-h", "help"}) {
    CliResult r = Cli({flag});
    EXPECT_EQ(r.code, kExitOk);
    EXPECT_THAT(r.out, HasSubstr("Exit codes:"));
    EXPECT_THAT(r.out, HasSubstr("Examples:"));
    EXPECT_THAT(r.out, HasSubstr("health"));
    EXPECT_THAT(r.out, HasSubstr("stats"));
  }
}

TEST(CliUsageTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Cli({}).code, kExitUsage);
  CliResult r = Cli({"frobnicate"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown command 'frobnicate'"));
  r = Cli({"--colour", "stats"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("unknown option '--colour'"));
  EXPECT_EQ(Cli({"stats", "extra"}).code, kExitUsage);
  EXPECT_EQ(Cli({"health", "a", "b"}).code, kExitUsage);
  EXPECT_EQ(Cli({"--socket"}).code, kExitUsage);
  r = Cli({"--timeout=-1", "health"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--timeout"));
}

TEST(CliUsageTest, PlainTcpIsRefusedWithoutTheTestingFlag) {
  CliResult r = Cli({"--target=127.0.0.1:1", "health"});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("TLS"));
}

TEST(CliUsageTest, UnreachableDaemonExitsOneWithAdvice) {
  testing::TempDir dir;
  CliResult r =
      Cli({"--timeout=0.5", "--socket=" + dir.Child("none.sock"), "health"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_THAT(r.err, HasSubstr("is hicached running"));
}

}  // namespace
}  // namespace hicache::ctl
