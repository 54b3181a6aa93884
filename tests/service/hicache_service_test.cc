#include "daemon/service/hicache_service.h"

#include <memory>

#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
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

TEST(HiCacheServiceTest, GetStatsReportsIdentityGeometryAndUptime) {
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  auto engine = HiCacheEngine::Create({.device_pages_per_rank = 8,
                                       .host_pages_per_rank = 8});
  ASSERT_TRUE(engine.ok()) << engine.status();
  SessionManager sessions(engine->get(), &clock, absl::Minutes(1));
  EventHub hub;
  WatchBroadcaster watch;
  HiCacheService service(TestInfo(clock.Now()), &clock,
                         ServiceParts{.engine = engine->get(),
                                      .sessions = &sessions,
                                      .hub = &hub,
                                      .watch = &watch});
  clock.Advance(absl::Seconds(90) + absl::Milliseconds(500));

  grpc::ServerContext context;
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  ASSERT_TRUE(service.GetStats(&context, &request, &response).ok());

  EXPECT_EQ(response.build().version(), "9.9.9");
  EXPECT_EQ(response.backend(), v1::BACKEND_CPU);
  EXPECT_EQ(response.geometry().cp_size(), 2u);
  ASSERT_EQ(response.geometry().served_ranks_size(), 1);
  EXPECT_EQ(response.geometry().served_ranks(0), 1u);
  EXPECT_DOUBLE_EQ(response.uptime_seconds(), 90.5);
  EXPECT_EQ(response.start_time_unix(), 1'700'000'000);
  EXPECT_EQ(response.listen_address(), "unix:/tmp/x.sock");
  EXPECT_EQ(response.pid(), 4242);
}

}  // namespace
}  // namespace hicache::service
