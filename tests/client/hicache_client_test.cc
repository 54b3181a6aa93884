// client::HiCacheClient: its channels carry the service config (gRPC's own
// retries and wait_for_ready for the reads, nothing else retried), over a
// unix socket and over TCP with TLS and mTLS, against real servers on real
// sockets.
#include "client/cpp/hicache_client.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "daemon/core/clock.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

DaemonConfig SmallConfig() {
  DaemonConfig config;
  config.page_size = 4;
  config.device_pages_per_rank = 8;
  config.host_pages_per_rank = 8;
  return config;
}

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

// Answers UNAVAILABLE to GetStats and Allocate and counts the attempts
// that reached it.
class UnavailableService final : public v1::HiCache::Service {
 public:
  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse*) override {
    ++get_stats;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: try again");
  }
  grpc::Status Allocate(grpc::ServerContext*, const v1::AllocateRequest*,
                        v1::AllocateResponse*) override {
    ++allocate;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: try again");
  }
  std::atomic<int> get_stats{0};
  std::atomic<int> allocate{0};
};

TEST(HiCacheClientTest, TheChannelCarriesTheServiceConfig) {
  testing::TempDir dir;
  auto client = client::HiCacheClient::Create(
      client::UnixTarget(dir.Child("nobody.sock")));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::shared_ptr<grpc::Channel>& channel = (*client)->channel();
  // The config is applied once the target resolved (the first connect).
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  const auto deadline = In(absl::Seconds(5));
  while (channel->GetServiceConfigJSON().empty() &&
         channel->WaitForStateChange(state, deadline)) {
    state = channel->GetState(true);
  }
  EXPECT_EQ(channel->GetServiceConfigJSON(), client::ServiceConfigJson());
}

TEST(HiCacheClientTest, ReadsAreRetriedByGrpcAndMutationsAreSentOnce) {
  testing::TempDir dir;
  const std::string socket = dir.Child("fake.sock");
  UnavailableService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(client::UnixTarget(socket),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto client = client::HiCacheClient::Create(client::UnixTarget(socket));
  ASSERT_TRUE(client.ok());
  auto stats = (*client)->GetStats(absl::Seconds(10));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service.get_stats.load(), client::kReadMaxAttempts);

  auto stub = v1::HiCache::NewStub((*client)->channel());
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(10)));
  v1::AllocateResponse response;
  const grpc::Status allocated =
      stub->Allocate(&context, v1::AllocateRequest(), &response);
  EXPECT_EQ(allocated.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(service.allocate.load(), 1);
  server->Shutdown(In(absl::Seconds(1)));
}

// The daemon is starting: its socket is not there yet. A read waits for it
// (wait_for_ready) and succeeds; a mutating call with a short deadline
// fails (UNAVAILABLE at once, or DEADLINE_EXCEEDED) rather than waiting or
// being retried.
TEST(HiCacheClientTest, AReadWaitsForAStartingDaemonAMutationDoesNot) {
  testing::TempDir dir;
  const std::string socket = dir.Child("late.sock");
  auto client = client::HiCacheClient::Create(client::UnixTarget(socket));
  ASSERT_TRUE(client.ok());
  auto stub = v1::HiCache::NewStub((*client)->channel());
  {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Milliseconds(500)));
    v1::AllocateResponse response;
    const absl::Time start = absl::Now();
    const grpc::Status allocated =
        stub->Allocate(&context, v1::AllocateRequest(), &response);
    EXPECT_TRUE(allocated.error_code() == grpc::StatusCode::UNAVAILABLE ||
                allocated.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << allocated.error_message();
    EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  }
  FakeClock clock{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server;
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(500));
    auto started = DaemonServer::Start(SmallConfig(), socket, &clock);
    ASSERT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
  });
  const absl::Time start = absl::Now();
  auto stats = (*client)->GetStats(absl::Seconds(20));  // Before the socket.
  late.join();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  // Found again within about a second (reconnect backoff <= 1 s).
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(stats->geometry().page_size_tokens(), 4u);
  EXPECT_EQ(*(*client)->CheckHealth(), client::ServingStatus::kServing);
}

TEST(HiCacheClientTest, ContradictoryOrUnreadableOptionsAreRefused) {
  testing::TempDir dir;
  auto refused = [](const std::string& target,
                    const client::ChannelOptions& options) {
    return client::HiCacheClient::Create(target, options).status();
  };
  EXPECT_EQ(refused("", {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused("unix:/tmp/x.sock", {.tls_ca_file = "/tmp/ca.pem"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused("unix:/tmp/x.sock", {.insecure_tcp = true}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused("127.0.0.1:1",
                    {.tls_ca_file = "/tmp/ca.pem", .insecure_tcp = true})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused("127.0.0.1:1", {.tls_cert_file = "/tmp/c.pem"}).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status missing =
      refused("127.0.0.1:1", {.tls_ca_file = dir.Child("missing.pem")});
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(), HasSubstr("missing.pem"));
}

// TLS and mTLS to a DaemonServer on TCP, with certificates openssl makes.
class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* ca : {"ca", "other-ca"}) {
      if (!Openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                    File(absl::StrCat(ca, ".key")), "-out",
                    File(absl::StrCat(ca, ".pem")), "-subj",
                    absl::StrCat("/CN=", ca), "-days", "1"})) {
        GTEST_SKIP() << "openssl could not make a CA here";
      }
    }
    Leaf("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost");
    Leaf("client", "ca", "extendedKeyUsage=clientAuth");
  }

  bool Openssl(std::vector<std::string> args) {
    args.insert(args.begin(), "/usr/bin/openssl");
    auto made = testing::Run(args);
    return made.ok() && made->exit_code == 0;
  }

  void Leaf(const std::string& name, const std::string& ca,
            const std::string& extension) {
    ASSERT_TRUE(Openssl({"req", "-newkey", "ec", "-pkeyopt",
                         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
                         File(name + ".key"), "-out", File(name + ".csr"),
                         "-subj", "/CN=" + name}));
    {
      std::FILE* ext = std::fopen(File(name + ".ext").c_str(), "w");
      ASSERT_NE(ext, nullptr);
      std::fputs((extension + "\n").c_str(), ext);
      std::fclose(ext);
    }
    ASSERT_TRUE(Openssl({"x509", "-req", "-in", File(name + ".csr"), "-CA",
                         File(ca + ".pem"), "-CAkey", File(ca + ".key"),
                         "-CAcreateserial", "-out", File(name + ".pem"),
                         "-days", "1", "-extfile", File(name + ".ext")}));
  }

  std::string File(const std::string& name) { return dir_.Child(name); }

  std::unique_ptr<DaemonServer> Start(bool require_client_cert) {
    DaemonConfig config = SmallConfig();
    config.listen_tcp = "127.0.0.1:0";
    config.tls_cert_file = File("server.pem");
    config.tls_key_file = File("server.key");
    if (require_client_cert) config.tls_client_ca_file = File("ca.pem");
    auto server = DaemonServer::Start(config, File("d.sock"), &clock_);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  absl::StatusOr<client::ServingStatus> Health(
      const DaemonServer& server, const client::ChannelOptions& options) {
    auto client = client::HiCacheClient::Create(
        absl::StrCat("127.0.0.1:", server.tcp_port()), options);
    if (!client.ok()) return client.status();
    return (*client)->CheckHealth("", absl::Seconds(3));
  }

  testing::TempDir dir_;
  FakeClock clock_{absl::FromUnixSeconds(100)};
};

TEST_F(TlsTest, TlsNeedsTheCa) {
  auto server = Start(/*require_client_cert=*/false);
  ASSERT_NE(server, nullptr);
  auto ok = Health(*server, {.tls_ca_file = File("ca.pem")});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, client::ServingStatus::kServing);
  auto by_name = client::HiCacheClient::Create(
      absl::StrCat("localhost:", server->tcp_port()),
      {.tls_ca_file = File("ca.pem"), .tls_server_name = "localhost"});
  ASSERT_TRUE(by_name.ok());
  EXPECT_TRUE((*by_name)->CheckHealth().ok());
  EXPECT_FALSE(Health(*server, {.wait_for_ready = false}).ok());
  EXPECT_FALSE(Health(*server, {.tls_ca_file = File("other-ca.pem"),
                                .wait_for_ready = false})
                   .ok());
  EXPECT_FALSE(
      Health(*server, {.insecure_tcp = true, .wait_for_ready = false}).ok());
}

TEST_F(TlsTest, MtlsNeedsAClientCertificate) {
  auto server = Start(/*require_client_cert=*/true);
  ASSERT_NE(server, nullptr);
  auto ok = Health(*server, {.tls_ca_file = File("ca.pem"),
                             .tls_cert_file = File("client.pem"),
                             .tls_key_file = File("client.key")});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, client::ServingStatus::kServing);
  auto without =
      Health(*server, {.tls_ca_file = File("ca.pem"), .wait_for_ready = false});
  EXPECT_FALSE(without.ok());
  EXPECT_TRUE(without.status().code() == absl::StatusCode::kUnavailable ||
              without.status().code() == absl::StatusCode::kDeadlineExceeded)
      << without.status();
}

}  // namespace
}  // namespace hicache
