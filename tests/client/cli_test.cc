#include "client/ctl/cli.h"

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.pb.h"
#include "tests/testing/temp_dir.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

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
    // Written against write_through_selective (an unbacked eviction
    // removes the node); the default is write_back.
    config.write_policy = WritePolicy::kWriteThroughSelective;
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
  EXPECT_THAT(r.out, HasSubstr("lane  device free"));  // Then the cache.

  r = Cli({"--socket=" + socket_, "--json", "stats"});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  // Two JSON objects, one per line: the daemon, then the cache.
  const std::vector<std::string> lines =
      absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << r.out;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(lines[0], &stats).ok())
      << r.out;
  v1::CacheStats cache;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(lines[1], &cache).ok());
  EXPECT_EQ(cache.lanes_size(), 4);
  EXPECT_EQ(stats.geometry().cp_size(), 4u);
  EXPECT_EQ(stats.geometry().served_ranks_size(), 2);
  EXPECT_EQ(stats.pid(), getpid());
}

TEST_F(CliTest, TargetOverridesSocket) {
  CliResult r =
      Cli({"--socket=/nonexistent.sock", "--target=unix:" + socket_, "health"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
}

// Cache commands against the daemon, with one cached request (node 2..).
class CacheCliTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    auto stub = std::shared_ptr<v1::HiCache::Stub>(
        v1::HiCache::NewStub(grpc::CreateChannel(
            client::UnixTarget(socket_), grpc::InsecureChannelCredentials())));
    session_ =
        *client::Session::Open(stub, "cli-test", v1::ROLE_SCHEDULER, 0, "");
    v1::AllocateItem item;
    item.set_num_pages(2);
    auto pages = *session_->Allocate({item});
    std::vector<int32_t> tokens(100);
    for (int i = 0; i < 100; ++i) tokens[i] = 7000 + i;
    v1::InsertRequest insert;
    insert.add_items()->set_tokens(client::PackTokens(tokens));
    *insert.mutable_items(0)->mutable_pages() = pages.allocations(0).pages();
    node_ = session_->Insert(insert)->results(0).node();
  }
  std::unique_ptr<client::Session> session_;
  uint64_t node_ = 0;
};

TEST_F(CacheCliTest, Tree) {
  CliResult r = Cli({"--socket=" + socket_, "tree"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat("#", node_, " [7000,7001,7002,7003..")));
  EXPECT_THAT(r.out, HasSubstr("len=100 device lock=0"));
  EXPECT_THAT(r.out, HasSubstr("owners=0,1"));  // One page in lane 0, one in 1.
  r = Cli({"--socket=" + socket_, "--json", "tree", "--sort", "hits", "--limit",
           "5"});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("\"length\":\"100\""));
  r = Cli({"--socket=" + socket_, "tree", "--prefix", "1,2,3"});
  EXPECT_EQ(r.out, "(empty)\n");
  EXPECT_EQ(Cli({"--socket=" + socket_, "tree", "--sort", "size"}).code,
            kExitUsage);
}

TEST_F(CacheCliTest, Node) {
  CliResult r = Cli({"--socket=" + socket_, "node", std::to_string(node_)});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tokens   0..100 (100)"));
  EXPECT_THAT(r.out, HasSubstr("page 0   owner"));
  EXPECT_EQ(Cli({"--socket=" + socket_, "node", "999999"}).code, kExitFailure);
  EXPECT_EQ(Cli({"--socket=" + socket_, "node"}).code, kExitUsage);
}

TEST_F(CacheCliTest, Match) {
  std::vector<std::string> tokens;
  for (int i = 0; i < 64; ++i) tokens.push_back(std::to_string(7000 + i));
  CliResult r =
      Cli({"--socket=" + socket_, "match", absl::StrJoin(tokens, ",")});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("device    64 tokens in 1 pages"));
  // A peek: the node's hit count is untouched.
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out, HasSubstr("hits=0"));
  const std::string file = dir_.Child("tokens.txt");
  std::ofstream(file) << "7000 7001 7002\n";
  r = Cli({"--socket=" + socket_, "match", "--file", file});
  EXPECT_THAT(r.out, HasSubstr("miss      3 tokens"));  // Floors to a page.
  EXPECT_EQ(Cli({"--socket=" + socket_, "match", "x,y"}).code, kExitUsage);
}

TEST_F(CacheCliTest, CacheStatsAndSessions) {
  CliResult r = Cli({"--socket=" + socket_, "cache-stats"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tree       1 nodes; device 100 tokens"));
  EXPECT_THAT(r.out, HasSubstr("lane  device free"));
  r = Cli({"--socket=" + socket_, "sessions"});
  EXPECT_THAT(r.out, HasSubstr("cli-test"));
  EXPECT_THAT(r.out, HasSubstr("scheduler"));
  r = Cli({"--socket=" + socket_, "--json", "sessions"});
  EXPECT_THAT(r.out, HasSubstr("\"client_name\":\"cli-test\""));
}

TEST_F(CacheCliTest, EvictPinUnpinFreeRoom) {
  CliResult r =
      Cli({"--socket=" + socket_, "evict", "--device", "10,10,10,10"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("evicted 2 device pages"));
  EXPECT_EQ(Cli({"--socket=" + socket_, "evict"}).code, kExitUsage);
  EXPECT_EQ(Cli({"--socket=" + socket_, "evict", "--device", "-1"}).code,
            kExitUsage);
  // The node was unbacked: eviction removed it, so pinning it fails.
  r = Cli({"--socket=" + socket_, "pin", std::to_string(node_), "--ttl-ms",
           "1000"});
  EXPECT_EQ(r.code, kExitFailure);
  EXPECT_EQ(Cli({"--socket=" + socket_, "pin", "5"}).code, kExitUsage);
  EXPECT_EQ(Cli({"--socket=" + socket_, "unpin", "x"}).code, kExitUsage);
  r = Cli({"--socket=" + socket_, "free-room", "--l1", "4", "--l2", "8"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("L1 4 pages per lane, L2 8 pages per rank"));
  EXPECT_EQ(Cli({"--socket=" + socket_, "free-room", "--l1", "-3"}).code,
            kExitUsage);
}

TEST_F(CacheCliTest, PinAndUnpinALiveNode) {
  CliResult r = Cli({"--socket=" + socket_, "pin", std::to_string(node_),
                     "--ttl-ms", "60000"});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out, HasSubstr(" pin="));
  r = Cli({"--socket=" + socket_, "unpin", std::to_string(node_)});
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(Cli({"--socket=" + socket_, "tree"}).out,
              Not(HasSubstr(" pin=")));
}

TEST_F(CacheCliTest, WatchPrintsLiveEvents) {
  std::thread closer([this] {
    absl::SleepFor(absl::Milliseconds(300));
    (void)session_->Close();
  });
  CliResult r = Cli({"--socket=" + socket_, "watch", "--count", "1"});
  closer.join();
  EXPECT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("session_closed"));
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
