#include "daemon/service/hicache_service.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/group/group_status.h"
#include "daemon/group/leader_view.h"
#include "daemon/service/watch_broadcaster.h"
#include "grpcpp/server_context.h"
#include "gtest/gtest.h"

namespace hicache::service {
namespace {

DaemonInfo TestInfo(absl::Time start) {
  DaemonConfig config;
  config.cp_size = 2;
  config.served_ranks = {1};
  return DaemonInfo{.build = {.version = "9.9.9",
                              .compiler = "c",
                              .build_mode = "m",
                              .cuda_support = false},
                    .config = config,
                    .start_time = start,
                    .listen_address = "unix:/tmp/x.sock",
                    .pid = 4242};
}

class FixedLeaderView final : public LeaderView {
 public:
  bool IsLeader() const override { return false; }
  std::string LeaderAddress() const override { return "10.0.0.1:7070"; }
};

// A service over a small real engine, with the group parts given.
class HiCacheServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = HiCacheEngine::Create({.device_pages_per_rank = 8,
                                         .host_pages_per_rank = 8});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1));
  }
  std::unique_ptr<HiCacheService> MakeService(
      const LeaderView* view = nullptr,
      std::function<std::optional<group::GroupStatus>()> source = {}) {
    return std::make_unique<HiCacheService>(
        TestInfo(clock_.Now()), &clock_,
        ServiceParts{.engine = engine_.get(),
                     .sessions = sessions_.get(),
                     .hub = &hub_,
                     .watch = &watch_,
                     .group = view,
                     .group_status = std::move(source)});
  }
  // GetStats through the handler (fails the test if it fails).
  void GetStats(HiCacheService& service, v1::GetStatsResponse* response) {
    grpc::ServerContext context;
    v1::GetStatsRequest request;
    ASSERT_TRUE(service.GetStats(&context, &request, response).ok());
  }

  FakeClock clock_{absl::FromUnixSeconds(1'700'000'000)};
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  EventHub hub_;
  WatchBroadcaster watch_;
};

TEST_F(HiCacheServiceTest, GetStatsReportsIdentityGeometryAndUptime) {
  std::unique_ptr<HiCacheService> service = MakeService();
  clock_.Advance(absl::Seconds(90) + absl::Milliseconds(500));
  v1::GetStatsResponse response;
  ASSERT_NO_FATAL_FAILURE(GetStats(*service, &response));

  EXPECT_EQ(response.build().version(), "9.9.9");
  EXPECT_EQ(response.backend(), v1::BACKEND_CPU);
  EXPECT_EQ(response.geometry().cp_size(), 2u);
  ASSERT_EQ(response.geometry().served_ranks_size(), 1);
  EXPECT_EQ(response.geometry().served_ranks(0), 1u);
  EXPECT_DOUBLE_EQ(response.uptime_seconds(), 90.5);
  EXPECT_EQ(response.start_time_unix(), 1'700'000'000);
  EXPECT_EQ(response.listen_address(), "unix:/tmp/x.sock");
  EXPECT_EQ(response.pid(), 4242);
  // A standalone daemon: no CP group.
  EXPECT_FALSE(response.has_cp_group());
}

TEST_F(HiCacheServiceTest, GetStatsReportsTheCpGroup) {
  FixedLeaderView view;
  int calls = 0;
  auto source = [&calls]() -> std::optional<group::GroupStatus> {
    ++calls;
    group::GroupStatus status{.name = "g1",
                              .role = group::GroupRole::kFollower,
                              .state = group::GroupState::kFormed,
                              .cp_size = 2,
                              .epoch = 4};
    status.members.push_back(
        {.index = 0, .name = "leader-node", .ranks = {0}, .epoch = 4});
    return status;
  };
  std::unique_ptr<HiCacheService> service = MakeService(&view, source);
  v1::GetStatsResponse response;
  ASSERT_NO_FATAL_FAILURE(GetStats(*service, &response));
  EXPECT_EQ(calls, 1);  // A fresh snapshot per call.
  ASSERT_TRUE(response.has_cp_group());
  EXPECT_EQ(response.cp_group().name(), "g1");
  EXPECT_EQ(response.cp_group().role(), "follower");
  EXPECT_EQ(response.cp_group().state(), "formed");
  EXPECT_EQ(response.cp_group().epoch(), 4u);
  EXPECT_EQ(response.cp_group().leader_address(), "10.0.0.1:7070");
  ASSERT_EQ(response.cp_group().members_size(), 1);
  EXPECT_EQ(response.cp_group().members(0).name(), "leader-node");
  EXPECT_EQ(response.cp_group().members(0).health(), "live");
}

TEST_F(HiCacheServiceTest, GetStatsWithASourceThatHasNoGroup) {
  std::unique_ptr<HiCacheService> service = MakeService(
      nullptr,
      []() -> std::optional<group::GroupStatus> { return std::nullopt; });
  v1::GetStatsResponse response;
  ASSERT_NO_FATAL_FAILURE(GetStats(*service, &response));
  EXPECT_FALSE(response.has_cp_group());
}

}  // namespace
}  // namespace hicache::service
