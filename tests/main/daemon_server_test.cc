#include "daemon/main/daemon_server.h"

#include <sys/stat.h>

#include <string>
#include <thread>

#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

class DaemonServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<client::HiCacheClient> Connect() {
    auto client = client::HiCacheClient::Create(client::UnixTarget(socket_));
    EXPECT_TRUE(client.ok());
    return *std::move(client);
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
  FakeClock clock_{absl::FromUnixSeconds(1'000'000)};
};

TEST_F(DaemonServerTest, ServesHealthAndStatsOnTheSocket) {
  DaemonConfig config;
  config.cp_size = 2;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->listen_address(), "unix:" + socket_);

  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  auto client = Connect();
  EXPECT_EQ(*client->CheckHealth(), client::ServingStatus::kServing);
  EXPECT_EQ(*client->CheckHealth(DaemonServer::kHealthServiceName),
            client::ServingStatus::kServing);
  EXPECT_EQ(*client->CheckHealth("no.such.Service"),
            client::ServingStatus::kServiceUnknown);

  clock_.Advance(absl::Seconds(42));
  auto stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_DOUBLE_EQ(stats->uptime_seconds(), 42.0);
  EXPECT_EQ(stats->geometry().cp_size(), 2u);
  EXPECT_EQ(stats->listen_address(), "unix:" + socket_);
  EXPECT_EQ(stats->pid(), getpid());
}

TEST_F(DaemonServerTest, ShutdownRemovesSocketAndIsIdempotent) {
  auto server = DaemonServer::Start(DaemonConfig(), socket_, &clock_);
  ASSERT_TRUE(server.ok());
  std::thread stopper([&] { (*server)->Shutdown(absl::Seconds(1)); });
  (*server)->Wait();
  stopper.join();
  (*server)->Shutdown(absl::Seconds(1));
  server->reset();
  struct stat st {};
  EXPECT_NE(stat(socket_.c_str(), &st), 0);
  // The path can be served again.
  EXPECT_TRUE(DaemonServer::Start(DaemonConfig(), socket_, &clock_).ok());
}

TEST_F(DaemonServerTest, SecondServerOnSamePathIsRefused) {
  auto first = DaemonServer::Start(DaemonConfig(), socket_, &clock_);
  ASSERT_TRUE(first.ok());
  auto second = DaemonServer::Start(DaemonConfig(), socket_, &clock_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  // The first keeps serving.
  EXPECT_EQ(*Connect()->CheckHealth(), client::ServingStatus::kServing);
}

TEST_F(DaemonServerTest, InvalidConfigIsRejectedBeforeTouchingTheSocket) {
  DaemonConfig config;
  config.page_size = 48;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("page_size"));
  struct stat st {};
  EXPECT_NE(stat((socket_ + ".lock").c_str(), &st), 0);
}

}  // namespace
}  // namespace hicache
