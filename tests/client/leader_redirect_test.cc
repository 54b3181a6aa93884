// CP group redirects in the C++ client (client/cpp/leader_redirect.h and
// Session::OpenAt) against fake daemons on loopback TCP (ports chosen by
// the OS): a follower names its leader in the hicache-leader trailer, the
// client opens there with the same options, at most one hop, and never
// follows a trailer that is not a valid target.

#include "client/cpp/leader_redirect.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/cpp/hicache_client.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::client {
namespace {

// OpenSession answers: a redirect to `leaders` (each a trailer) as
// FAILED_PRECONDITION, or a session. Counts the calls.
class FakeDaemon final : public v1::HiCache::Service {
 public:
  explicit FakeDaemon(std::vector<std::string> leaders = {})
      : leaders_(std::move(leaders)) {}

  grpc::Status OpenSession(grpc::ServerContext* context,
                           const v1::OpenSessionRequest* request,
                           v1::OpenSessionResponse* response) override {
    opens_.fetch_add(1);
    if (request->role() == v1::ROLE_SCHEDULER && !leaders_.empty()) {
      for (const std::string& leader : leaders_) {
        context->AddTrailingMetadata(kLeaderTrailer, leader);
      }
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "not the CP group leader; the leader is " +
                              leaders_.front());
    }
    response->set_session_id("s-" + request->client_name());
    response->set_lease_ms(60000);
    return grpc::Status::OK;
  }
  // Tree calls: redirected like a follower's, whoever asks.
  grpc::Status MatchPrefix(grpc::ServerContext* context,
                           const v1::MatchPrefixRequest*,
                           v1::MatchPrefixResponse*) override {
    return Refuse(context);
  }
  grpc::Status Allocate(grpc::ServerContext* context,
                        const v1::AllocateRequest*,
                        v1::AllocateResponse*) override {
    return Refuse(context);
  }
  grpc::Status CloseSession(grpc::ServerContext*,
                            const v1::CloseSessionRequest*,
                            v1::CloseSessionResponse*) override {
    closes_.fetch_add(1);
    return grpc::Status::OK;
  }

  grpc::Status Refuse(grpc::ServerContext* context) {
    if (leaders_.empty()) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake");
    }
    for (const std::string& leader : leaders_) {
      context->AddTrailingMetadata(kLeaderTrailer, leader);
    }
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "not the CP group leader");
  }

  int opens() const { return opens_.load(); }
  int closes() const { return closes_.load(); }

 private:
  const std::vector<std::string> leaders_;
  std::atomic<int> opens_{0};
  std::atomic<int> closes_{0};
};

struct Running {
  std::unique_ptr<FakeDaemon> daemon;
  std::unique_ptr<grpc::Server> server;
  std::string target;

  ~Running() {
    if (server != nullptr) server->Shutdown();
  }
};

std::unique_ptr<Running> Serve(std::vector<std::string> leaders = {}) {
  auto running = std::make_unique<Running>();
  running->daemon = std::make_unique<FakeDaemon>(std::move(leaders));
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(running->daemon.get());
  running->server = builder.BuildAndStart();
  EXPECT_NE(running->server, nullptr);
  EXPECT_GT(port, 0);
  running->target = "127.0.0.1:" + std::to_string(port);
  return running;
}

ChannelOptions Insecure() {
  ChannelOptions options;
  options.insecure_tcp = true;
  return options;
}

TEST(LeaderRedirectTest, ValidTargets) {
  for (const char* good : {"leader:7443", "10.0.0.1:1", "[::1]:5000",
                           "dns:///leader.example:443", "a-b.example:65535"}) {
    EXPECT_TRUE(IsValidLeaderTarget(good)) << good;
  }
  for (const std::string& bad : std::vector<std::string>{
           "", "leader", "leader:0", "leader:65536", "unix:/tmp/x.sock",
           "ipv4:1.2.3.4:5", "x:1/path", "user@x:1", "-x:1", "a b:1",
           "[zz]:1", std::string("x\0:1", 4), "x:1\r",
           std::string(kMaxLeaderAddressBytes, 'a') + ":1"}) {
    EXPECT_FALSE(IsValidLeaderTarget(bad)) << bad;
  }
}

TEST(LeaderRedirectTest, LeaderOfAStatusWithoutPayloadIsNone) {
  EXPECT_FALSE(LeaderOf(absl::OkStatus()).has_value());
  EXPECT_FALSE(LeaderOf(absl::FailedPreconditionError("x")).has_value());
  absl::Status forged = absl::FailedPreconditionError("x");
  forged.SetPayload(kLeaderPayloadUrl, absl::Cord("unix:/tmp/evil"));
  EXPECT_FALSE(LeaderOf(forged).has_value());
}

TEST(LeaderRedirectTest, OpenAtFollowsOneRedirectWithTheSameOptions) {
  std::unique_ptr<Running> leader = Serve();
  std::unique_ptr<Running> follower = Serve({leader->target});
  std::string opened_at;
  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::OpenAt(follower->target, Insecure(), "sched",
                      v1::ROLE_SCHEDULER, 0, "", absl::Seconds(60),
                      absl::ZeroDuration(), &opened_at);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ((*session)->id(), "s-sched");
  EXPECT_EQ(opened_at, leader->target);
  EXPECT_EQ(follower->daemon->opens(), 1);
  EXPECT_EQ(leader->daemon->opens(), 1);
  // The session's calls go to the leader.
  ASSERT_TRUE((*session)->Close().ok());
  EXPECT_EQ(leader->daemon->closes(), 1);
  EXPECT_EQ(follower->daemon->closes(), 0);
}

// A scheduler on the follower's node reaches it on its unix socket and
// follows the redirect to a TCP leader: the options (TCP) are for the
// leader only, not refused for the unix hop.
TEST(LeaderRedirectTest, OpenAtFromAUnixFollowerToATcpLeader) {
  std::unique_ptr<Running> leader = Serve();
  auto follower = std::make_unique<FakeDaemon>(
      std::vector<std::string>{leader->target});
  char dir_template[] = "/tmp/hicache-redirect-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string socket = std::string(dir_template) + "/f.sock";
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket,
                           grpc::InsecureServerCredentials());
  builder.RegisterService(follower.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::string opened_at;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::OpenAt(
      "unix:" + socket, Insecure(), "sched", v1::ROLE_SCHEDULER, 0, "",
      absl::Seconds(60), absl::ZeroDuration(), &opened_at);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(opened_at, leader->target);
  EXPECT_EQ(follower->opens(), 1);
  EXPECT_EQ(leader->daemon->opens(), 1);
  ASSERT_TRUE((*session)->Close().ok());
  server->Shutdown();
  unlink(socket.c_str());
  rmdir(dir_template);
}

TEST(LeaderRedirectTest, PlainOpenReportsTheLeaderWithoutFollowing) {
  std::unique_ptr<Running> follower = Serve({"leader.example:7443"});
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      HiCacheClient::NewChannel(follower->target, Insecure());
  ASSERT_TRUE(channel.ok());
  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::Open(v1::HiCache::NewStub(*channel), "sched",
                    v1::ROLE_SCHEDULER, 0, "");
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(LeaderOf(session.status()), "leader.example:7443");
}

TEST(LeaderRedirectTest, AWorkerIsNotRedirected) {
  std::unique_ptr<Running> follower = Serve({"leader.example:7443"});
  std::string opened_at;
  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::OpenAt(follower->target, Insecure(), "w", v1::ROLE_WORKER, 0,
                      "", absl::Seconds(60), absl::ZeroDuration(), &opened_at);
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_EQ(opened_at, follower->target);
}

TEST(LeaderRedirectTest, EveryRefusedCallCarriesTheLeader) {
  std::unique_ptr<Running> follower = Serve({"leader.example:7443"});
  absl::StatusOr<std::unique_ptr<Session>> session =
      Session::OpenAt(follower->target, Insecure(), "w", v1::ROLE_WORKER, 0,
                      "", absl::Seconds(60));
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<v1::MatchPrefixResponse> match =
      (*session)->MatchPrefix({{1, 2, 3, 4}});
  ASSERT_FALSE(match.ok());
  EXPECT_EQ(LeaderOf(match.status()), "leader.example:7443");
  EXPECT_TRUE(absl::StartsWith(match.status().message(), "MatchPrefix: "));
  absl::StatusOr<v1::AllocateResponse> pages =
      (*session)->Allocate({v1::AllocateItem()});
  ASSERT_FALSE(pages.ok());
  EXPECT_EQ(LeaderOf(pages.status()), "leader.example:7443");
}

TEST(LeaderRedirectTest, AtMostOneHop) {
  std::unique_ptr<Running> third = Serve();
  std::unique_ptr<Running> second = Serve({third->target});
  std::unique_ptr<Running> first = Serve({second->target});
  absl::StatusOr<std::unique_ptr<Session>> session = Session::OpenAt(
      first->target, Insecure(), "sched", v1::ROLE_SCHEDULER, 0, "");
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(session.status().message());
  EXPECT_NE(message.find(second->target), std::string::npos) << message;
  EXPECT_NE(message.find(third->target), std::string::npos) << message;
  EXPECT_NE(message.find("one hop"), std::string::npos) << message;
  EXPECT_FALSE(LeaderOf(session.status()).has_value());
  EXPECT_EQ(third->daemon->opens(), 0);
}

TEST(LeaderRedirectTest, ALeaderThatNamesItselfIsALoopNotFollowedTwice) {
  // The follower names a daemon that redirects back to the follower.
  std::unique_ptr<Running> a = Serve({"127.0.0.1:1"});
  std::unique_ptr<Running> b = Serve({a->target});
  absl::StatusOr<std::unique_ptr<Session>> session = Session::OpenAt(
      b->target, Insecure(), "sched", v1::ROLE_SCHEDULER, 0, "");
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(b->daemon->opens(), 1);
  EXPECT_EQ(a->daemon->opens(), 1);
}

TEST(LeaderRedirectTest, GarbageOrOversizedTrailersAreNotFollowed) {
  for (const std::vector<std::string>& leaders :
       std::vector<std::vector<std::string>>{
           {"unix:/tmp/evil.sock"},
           {"evil:1/path"},
           {"user@evil:1"},
           {std::string(300, 'a') + ":1"},
           {std::string(4000, 'b')},
           {"127.0.0.1:1", "127.0.0.1:2"}}) {
    std::unique_ptr<Running> follower = Serve(leaders);
    absl::StatusOr<std::unique_ptr<Session>> session = Session::OpenAt(
        follower->target, Insecure(), "sched", v1::ROLE_SCHEDULER, 0, "");
    ASSERT_FALSE(session.ok());
    EXPECT_FALSE(LeaderOf(session.status()).has_value());
    const std::string message(session.status().message());
    if (leaders.front().size() > 1000) {
      // gRPC's own metadata limit refuses it before the client sees it.
      EXPECT_EQ(session.status().code(),
                absl::StatusCode::kResourceExhausted);
      continue;
    }
    EXPECT_EQ(session.status().code(), absl::StatusCode::kFailedPrecondition);
    const size_t note = message.find("not followed)");
    EXPECT_NE(note, std::string::npos) << message;
    // The client's note does not repeat the value (only the daemon's own
    // message, which names leaders.front(), does).
    const size_t opening = message.rfind(" (the daemon named");
    ASSERT_NE(opening, std::string::npos) << message;
    EXPECT_EQ(message.find(leaders.front(), opening), std::string::npos)
        << message;
  }
}

TEST(LeaderRedirectTest, AnUnreachableLeaderNamesBothDaemons) {
  std::unique_ptr<Running> follower = Serve({"127.0.0.1:1"});
  absl::StatusOr<std::unique_ptr<Session>> session = Session::OpenAt(
      follower->target, Insecure(), "sched", v1::ROLE_SCHEDULER, 0, "");
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), absl::StatusCode::kUnavailable);
  const std::string message(session.status().message());
  EXPECT_NE(message.find("127.0.0.1:1"), std::string::npos) << message;
  EXPECT_NE(message.find(follower->target), std::string::npos) << message;
}

}  // namespace
}  // namespace hicache::client
