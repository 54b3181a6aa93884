// Issue 11 reproductions that need a real daemon process: descriptor
// exhaustion (reproduction 9) and operator roles from unix peer credentials,
// with the real hicached and hicachectl, the latter run as another user.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/binaries.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::Subprocess;

using testing::CtlPath;
using testing::DaemonPath;

// A channel with a connection of its own (no subchannel sharing) to a
// gRPC target ("unix:...", "127.0.0.1:port").
std::shared_ptr<grpc::Channel> OwnChannelTo(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                   args);
}
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& socket) {
  return OwnChannelTo(client::UnixTarget(socket));
}

bool Stats(grpc::Channel* channel, absl::Duration timeout) {
  auto stub = v1::HiCache::NewStub(
      std::shared_ptr<grpc::Channel>(channel, [](grpc::Channel*) {}));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::GetStatsResponse response;
  return stub->GetStats(&ctx, v1::GetStatsRequest(), &response).ok();
}

class HostileClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Another user must reach the socket: the directory is world-searchable
    // and the socket is opened to everyone by the test (never in production).
    chmod(dir_.path().c_str(), 0755);
  }

  Subprocess StartDaemon(std::vector<std::string> prefix,
                         std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = std::move(prefix);
    argv.push_back(DaemonPath());
    argv.push_back("--socket=" + socket_);
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(argv);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && daemon->Running()) {
      auto channel = OwnChannel(socket_);
      if (Stats(channel.get(), absl::Seconds(1))) {
        chmod(socket_.c_str(), 0666);
        return *std::move(daemon);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "hicached did not start; stderr:\n" << daemon->Stderr();
    return *std::move(daemon);
  }

  RunResult CtlAs(const std::string& uid, std::vector<std::string> args) {
    std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=" + uid,
                                     "--regid=" + uid, "--clear-groups",
                                     CtlPath(), "--socket=" + socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<RunResult> result = testing::Run(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : RunResult{};
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
};

// Floods `target` with far more connections than a daemon limited to 64
// descriptors has, then checks that it refused some, kept serving the
// connection made before, and serves new ones once the flood is gone.
void ExpectSurvivesDescriptorExhaustion(Subprocess& daemon,
                                        const std::string& target) {
  auto first = OwnChannelTo(target);
  ASSERT_TRUE(Stats(first.get(), absl::Seconds(5)));
  std::vector<std::shared_ptr<grpc::Channel>> flood;
  int refused = 0;
  for (int i = 0; i < 100; ++i) {
    flood.push_back(OwnChannelTo(target));
    if (!Stats(flood.back().get(), absl::Milliseconds(500))) ++refused;
  }
  EXPECT_GT(refused, 0) << "the flood never exhausted the daemon's fds";
  // Connections made before keep working.
  EXPECT_TRUE(Stats(first.get(), absl::Seconds(5)));
  flood.clear();  // Their connections close; the daemon's fds come back.
  bool recovered = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!recovered && absl::Now() < deadline) {
    auto fresh = OwnChannelTo(target);
    recovered = Stats(fresh.get(), absl::Seconds(1));
  }
  EXPECT_TRUE(recovered) << daemon.Stderr();
  EXPECT_THAT(daemon.Stderr(), HasSubstr("out of file descriptors"));
  EXPECT_TRUE(daemon.Running());
}

// Reproduction 9: after file-descriptor exhaustion, new connections failed
// until the daemon restarted.
TEST_F(HostileClientTest, DescriptorExhaustionDoesNotWedgeTheListener) {
  Subprocess daemon = StartDaemon({"/usr/bin/prlimit", "--nofile=64:64"});
  ExpectSurvivesDescriptorExhaustion(daemon, client::UnixTarget(socket_));
}

// The same over --listen_tcp (issue 26): gRPC's own TCP acceptor stopped
// accepting for good after an EMFILE; the daemon's listener sheds instead.
TEST_F(HostileClientTest, DescriptorExhaustionDoesNotWedgeTheTcpListener) {
  Subprocess daemon = StartDaemon(
      {"/usr/bin/prlimit", "--nofile=64:64"},
      {"--listen_tcp=127.0.0.1:0", "--insecure_tcp_for_testing"});
  // The port the daemon bound, from its start-up line.
  int port = 0;
  const std::string err = daemon.Stderr();
  const size_t at = err.find("and TCP port ");
  ASSERT_NE(at, std::string::npos) << err;
  ASSERT_TRUE(absl::SimpleAtoi(
      absl::string_view(err).substr(at + 13, err.find(':', at) - at - 13),
      &port))
      << err;
  ExpectSurvivesDescriptorExhaustion(daemon,
                                     absl::StrCat("127.0.0.1:", port));
}

TEST_F(HostileClientTest, OperatorRpcsNeedAnOperatorPeer) {
  Subprocess daemon = StartDaemon({});
  // nobody (65534) is no operator: refused, with the reason.
  RunResult evict = CtlAs("65534", {"evict", "--device", "1"});
  EXPECT_EQ(evict.exit_code, 1) << evict.out << evict.err;
  EXPECT_THAT(evict.err, HasSubstr("operator RPC"));
  EXPECT_THAT(evict.err, HasSubstr("uid 65534"));
  RunResult sessions = CtlAs("65534", {"sessions"});
  EXPECT_EQ(sessions.exit_code, 1);
  RunResult tiers = CtlAs("65534", {"tiers", "1,2,3"});
  EXPECT_EQ(tiers.exit_code, 1) << tiers.out << tiers.err;
  EXPECT_THAT(tiers.err, HasSubstr("operator RPC"));
  // Health and identity stay open to every local user.
  EXPECT_EQ(CtlAs("65534", {"health"}).exit_code, 0);
  // Root is an operator.
  absl::StatusOr<RunResult> as_root = testing::Run(
      {CtlPath(), "--socket=" + socket_, "evict", "--device", "1"});
  ASSERT_TRUE(as_root.ok());
  EXPECT_EQ(as_root->exit_code, 0) << as_root->err;
}

TEST_F(HostileClientTest, OperatorUidFlagGrantsTheRole) {
  Subprocess daemon = StartDaemon({}, {"--operator_uids=65534"});
  RunResult evict = CtlAs("65534", {"evict", "--device", "1"});
  EXPECT_EQ(evict.exit_code, 0) << evict.err;
}

}  // namespace
}  // namespace hicache
