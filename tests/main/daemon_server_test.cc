#include "daemon/main/daemon_server.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "tests/testing/subprocess.h"

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

TEST_F(DaemonServerTest, PlainTcpOnlyForTesting) {
  DaemonConfig config;
  config.listen_tcp = "127.0.0.1:0";
  EXPECT_EQ(DaemonServer::Start(config, socket_, &clock_).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.insecure_tcp_for_testing = true;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->tcp_port(), 0);
  auto client = client::HiCacheClient::Create(
      absl::StrCat("127.0.0.1:", (*server)->tcp_port()), /*insecure_tcp=*/true);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ(*(*client)->CheckHealth(), client::ServingStatus::kServing);
}

TEST_F(DaemonServerTest, TcpWithTls) {
  const std::string cert = dir_.Child("cert.pem");
  const std::string key = dir_.Child("key.pem");
  auto made = testing::Run({"/usr/bin/openssl", "req", "-x509", "-newkey",
                            "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                            "-subj", "/CN=localhost", "-days", "1",
                            "-addext", "subjectAltName=DNS:localhost"});
  if (!made.ok() || made->exit_code != 0) {
    GTEST_SKIP() << "openssl could not make a certificate here";
  }
  DaemonConfig config;
  config.listen_tcp = "127.0.0.1:0";
  config.tls_cert_file = cert;
  config.tls_key_file = key;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  ASSERT_TRUE(server.ok()) << server.status();
  std::ifstream in(cert);
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = pem.str();
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("localhost");
  client::HiCacheClient tls(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", (*server)->tcp_port()),
      grpc::SslCredentials(options), args));
  auto health = tls.CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, client::ServingStatus::kServing);
  // A plain-text client cannot talk to the TLS port.
  auto plain = client::HiCacheClient::Create(
      absl::StrCat("127.0.0.1:", (*server)->tcp_port()), true);
  EXPECT_FALSE((*plain)->CheckHealth("", absl::Seconds(1)).ok());
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

// The engine is built from the config by EngineOptionsFrom, and GetStats
// reports the policies by name, as the flags spell them.
TEST_F(DaemonServerTest, StatsReportThePoliciesByName) {
  DaemonConfig config;
  config.write_policy = WritePolicy::kWriteBack;
  config.eviction_policy = EvictionPolicy::kFifo;
  config.write_through_threshold = 3;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stats = Connect()->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->settings().write_policy(), "write_back");
  EXPECT_EQ(stats->settings().eviction_policy(), "fifo");
  EXPECT_EQ(stats->settings().write_through_threshold(), 3u);
}

// One per-rank byte budget sizes the host tier: as many pages as fit, each
// holding the target and the draft payload ("tiny-draft" at P = 4: 160
// bytes), and GetStats reports those pages.
TEST_F(DaemonServerTest, HostByteBudgetSizesTheHostTier) {
  DaemonConfig config;
  config.kv_preset = "tiny-draft";
  config.page_size = 4;
  config.host_bytes_per_rank = 160 * 50 + 159;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stats = Connect()->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->geometry().host_pages_per_rank(), 50u);
}

TEST_F(DaemonServerTest, HostByteBudgetBelowOnePageIsRejected) {
  DaemonConfig config;
  config.kv_preset = "tiny-draft";
  config.page_size = 4;
  config.host_bytes_per_rank = 159;
  auto server = DaemonServer::Start(config, socket_, &clock_);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(server.status().message(), HasSubstr("holds no host page"));
  struct stat st {};
  EXPECT_NE(stat((socket_ + ".lock").c_str(), &st), 0);
}

}  // namespace
}  // namespace hicache
