// hicachectl against a daemon in a CP group: `stats` shows the group
// (human and --json), and a call a follower refuses names the leader.
// A fake daemon (any GetStats, any trailer) and a real one
// (DaemonServer with the follower view --cp_group_test_non_leader_of
// gives).

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "client/ctl/cli.h"
#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/group/group_status.h"
#include "daemon/main/daemon_server.h"
#include "daemon/main/static_leader_view.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

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

v1::CpGroupStatus LeaderGroup() {
  v1::CpGroupStatus g;
  g.set_name("g1");
  g.set_role("leader");
  g.set_state("degraded");
  g.set_cp_size(8);
  g.set_epoch(3);
  g.set_leader_address("10.0.0.1:7070");
  g.set_deaths(1);
  v1::CpGroupMember* self = g.add_members();
  self->set_index(0);
  self->set_name("node-a");
  self->add_ranks(0);
  self->add_ranks(1);
  self->set_health("live");
  v1::CpGroupMember* b = g.add_members();
  b->set_index(1);
  b->set_name("node-b");
  for (uint32_t r : {4, 5, 6, 7}) b->add_ranks(r);
  b->set_health("live");
  b->set_last_heard_age_ms(40);
  b->set_readmissions(2);
  v1::CpGroupMember* c = g.add_members();
  c->set_index(2);
  c->set_name("node-c");
  c->add_ranks(2);
  c->add_ranks(3);
  c->set_health("dead");
  c->set_last_heard_age_ms(2500);
  c->set_reason("heartbeat timeout after 1s");
  return g;
}

// GetStats answers `stats`; OpenSession (as scheduler) and DumpTree are
// refused with FAILED_PRECONDITION and `trailers` as hicache-leader.
class FakeDaemon final : public v1::HiCache::Service {
 public:
  FakeDaemon(std::optional<v1::CpGroupStatus> group,
             std::vector<std::string> trailers)
      : group_(std::move(group)), trailers_(std::move(trailers)) {}

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse* response) override {
    response->mutable_build()->set_version("9.9.9");
    response->mutable_geometry()->set_cp_size(8);
    response->set_pid(7);
    if (group_.has_value()) *response->mutable_cp_group() = *group_;
    return grpc::Status::OK;
  }
  grpc::Status Stats(grpc::ServerContext*, const v1::GetStatsRequest*,
                     v1::CacheStats*) override {
    return grpc::Status::OK;
  }
  grpc::Status OpenSession(grpc::ServerContext* context,
                           const v1::OpenSessionRequest*,
                           v1::OpenSessionResponse*) override {
    return Refuse(context);
  }
  grpc::Status DumpTree(grpc::ServerContext* context,
                        const v1::DumpTreeRequest*,
                        v1::DumpTreeResponse*) override {
    return Refuse(context);
  }

 private:
  grpc::Status Refuse(grpc::ServerContext* context) {
    for (const std::string& t : trailers_) {
      context->AddTrailingMetadata("hicache-leader", t);
    }
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "not the CP group leader");
  }

  const std::optional<v1::CpGroupStatus> group_;
  const std::vector<std::string> trailers_;
};

class FakeServer {
 public:
  FakeServer(const std::string& socket, std::optional<v1::CpGroupStatus> group,
             std::vector<std::string> trailers = {})
      : daemon_(std::move(group), std::move(trailers)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(&daemon_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
  }
  ~FakeServer() {
    if (server_ != nullptr) server_->Shutdown();
  }

 private:
  FakeDaemon daemon_;
  std::unique_ptr<grpc::Server> server_;
};

class CliGroupTest : public ::testing::Test {
 protected:
  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
};

TEST_F(CliGroupTest, HumanStatsShowTheGroup) {
  FakeServer server(socket_, LeaderGroup());
  const CliResult r = Cli({"--socket=" + socket_, "stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("CP group:\n"));
  EXPECT_THAT(r.out, HasSubstr("  name:        g1\n"));
  EXPECT_THAT(r.out, HasSubstr("  role:        leader\n"));
  EXPECT_THAT(r.out, HasSubstr("  state:       degraded\n"));
  EXPECT_THAT(r.out, HasSubstr("  epoch:       3 (cp size 8)\n"));
  EXPECT_THAT(r.out, HasSubstr("  leader:      10.0.0.1:7070\n"));
  EXPECT_THAT(r.out, HasSubstr("  deaths:      1\n"));
  EXPECT_THAT(r.out,
              HasSubstr("    #  NAME    RANKS  HEALTH  HEARD     READMITS  "
                        "REASON\n"));
  EXPECT_THAT(r.out,
              HasSubstr("    0  node-a  0-1    live    -         0\n"));
  EXPECT_THAT(r.out,
              HasSubstr("    1  node-b  4-7    live    40ms ago  2\n"));
  EXPECT_THAT(r.out,
              HasSubstr("    2  node-c  2-3    dead    2.5s ago  0         "
                        "heartbeat timeout after 1s\n"));
}

TEST_F(CliGroupTest, JsonStatsCarryTheGroup) {
  FakeServer server(socket_, LeaderGroup());
  const CliResult r = Cli({"--socket=" + socket_, "--json", "stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json doc = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  const Json& g = doc["daemon"]["cp_group"];
  EXPECT_EQ(g["name"], "g1");
  EXPECT_EQ(g["role"], "leader");
  EXPECT_EQ(g["state"], "degraded");
  EXPECT_EQ(g["epoch"], "3");  // int64: proto3 JSON.
  EXPECT_EQ(g["leader_address"], "10.0.0.1:7070");
  ASSERT_EQ(g["members"].size(), 3u);
  EXPECT_EQ(g["members"][1]["ranks"], Json({4, 5, 6, 7}));
  EXPECT_EQ(g["members"][2]["health"], "dead");
  EXPECT_EQ(g["members"][2]["reason"], "heartbeat timeout after 1s");
  EXPECT_EQ(g["members"][2]["last_heard_age_ms"], "2500");
  // It parses back into the message.
  v1::GetStatsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  doc["daemon"].dump(), &parsed)
                  .ok());
  EXPECT_EQ(parsed.cp_group().members(1).readmissions(), 2);
}

TEST_F(CliGroupTest, StandaloneStatsHaveNoGroup) {
  FakeServer server(socket_, std::nullopt);
  CliResult r = Cli({"--socket=" + socket_, "stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("CP group")));
  r = Cli({"--socket=" + socket_, "--json", "stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json doc = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  EXPECT_FALSE(doc["daemon"].contains("cp_group")) << r.out;
  // The fake sets no settings: an unset message is left out.
  EXPECT_FALSE(doc["daemon"].contains("settings"));
  EXPECT_TRUE(doc["daemon"].contains("pid"));
}

TEST_F(CliGroupTest, ARefusedCallNamesTheLeader) {
  FakeServer server(socket_, std::nullopt, {"10.0.0.1:7070"});
  const std::string hint =
      "(this daemon is a CP group follower; the leader is 10.0.0.1:7070 "
      "(use --target 10.0.0.1:7070))";
  // Through a temporary session (OpenSession refused).
  CliResult r = Cli({"--socket=" + socket_, "match", "1,2,3"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("FAILED_PRECONDITION: not the CP group leader"));
  EXPECT_THAT(r.err, HasSubstr(hint));
  // A plain call (DumpTree refused).
  r = Cli({"--socket=" + socket_, "tree"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr(hint)) << r.err;
}

TEST_F(CliGroupTest, GarbageOrRepeatedLeaderTrailersGiveNoHint) {
  for (const std::vector<std::string>& trailers :
       std::vector<std::vector<std::string>>{
           {"unix:/tmp/evil.sock"},
           {"host:99999"},
           {std::string(300, 'a') + ":1"},
           {"10.0.0.1:7070", "10.0.0.2:7070"}}) {
    const std::string socket =
        dir_.Child("g" + std::to_string(trailers.size()) + "-" +
                   std::to_string(trailers[0].size()) + ".sock");
    FakeServer server(socket, std::nullopt, trailers);
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{
             {"--socket=" + socket, "match", "1,2,3"},
             {"--socket=" + socket, "tree"}}) {
      const CliResult r = Cli(args);
      EXPECT_NE(r.code, 0);
      EXPECT_THAT(r.err,
                  HasSubstr("FAILED_PRECONDITION: not the CP group leader"));
      EXPECT_THAT(r.err, Not(HasSubstr("CP group follower"))) << r.err;
      EXPECT_THAT(r.err, Not(HasSubstr("--target"))) << r.err;
    }
  }
}

// A real daemon with the follower view --cp_group_test_non_leader_of gives:
// stats show a forming follower; tree RPCs name the leader.
TEST_F(CliGroupTest, RealFollowerDaemon) {
  DaemonConfig config;
  config.cp_size = 2;
  group::GroupStatus status{.role = group::GroupRole::kFollower,
                            .state = group::GroupState::kForming,
                            .cp_size = 2};
  status.members.push_back(
      {.index = 0, .name = "127.0.0.1:7070", .live = false});
  auto server = DaemonServer::Start(
      config, socket_, Clock::Real(),
      std::make_unique<StaticLeaderView>(false, "127.0.0.1:7070"),
      [status]() -> std::optional<group::GroupStatus> { return status; });
  ASSERT_TRUE(server.ok()) << server.status();

  CliResult r = Cli({"--socket=" + socket_, "stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("  role:        follower\n"));
  EXPECT_THAT(r.out, HasSubstr("  state:       forming\n"));
  EXPECT_THAT(r.out, HasSubstr("  leader:      127.0.0.1:7070\n"));
  EXPECT_THAT(r.out, HasSubstr("    0  127.0.0.1:7070  none   unknown"));
  // Its cache is the leader's.
  EXPECT_THAT(r.out, HasSubstr("cache          kept by the CP group leader "
                               "(hicachectl --target 127.0.0.1:7070 "
                               "cache-stats)\n"));
  r = Cli({"--socket=" + socket_, "--json", "stats"});
  ASSERT_EQ(r.code, 0) << r.err;
  const Json doc = Json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  EXPECT_EQ(doc["daemon"]["cp_group"]["role"], "follower");
  EXPECT_EQ(doc["daemon"]["cp_group"]["state"], "forming");
  EXPECT_EQ(doc["daemon"]["cp_group"]["leader_address"], "127.0.0.1:7070");
  EXPECT_EQ(doc["daemon"]["cp_group"]["members"][0]["health"], "unknown");
  EXPECT_FALSE(doc.contains("cache"));

  r = Cli({"--socket=" + socket_, "match", "1,2,3"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("the leader is 127.0.0.1:7070 (use --target "
                               "127.0.0.1:7070)"));
  (*server)->Shutdown(absl::ZeroDuration());
}

}  // namespace
}  // namespace hicache::ctl
