#include "client/ctl/rpc_error.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string Describe(grpc::StatusCode code, const std::string& message,
                     const std::string& socket = "") {
  return DescribeRpcError(grpc::Status(code, message),
                          socket.empty() ? "host:1" : "unix:" + socket, socket,
                          absl::Seconds(5));
}

TEST(RpcErrorTest, CodesInWords) {
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::PERMISSION_DENIED),
            "PERMISSION_DENIED");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNAVAILABLE), "UNAVAILABLE");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::DATA_LOSS), "DATA_LOSS");
  EXPECT_EQ(GrpcCodeName(static_cast<grpc::StatusCode>(99)), "CODE_99");
}

TEST(RpcErrorTest, EachCodeSaysWhatToDo) {
  EXPECT_EQ(Describe(grpc::StatusCode::PERMISSION_DENIED,
                     "DumpTree is an operator RPC"),
            "PERMISSION_DENIED: DumpTree is an operator RPC (operator RPCs "
            "need root or hicached --operator_uids/--operator_gids; see "
            "docs/security.md)");
  EXPECT_THAT(Describe(grpc::StatusCode::DEADLINE_EXCEEDED, "x"),
              HasSubstr("DEADLINE_EXCEEDED: no answer from host:1 within 5s"));
  EXPECT_THAT(Describe(grpc::StatusCode::UNAUTHENTICATED, "no cert"),
              HasSubstr("--tls_cert_file"));
  EXPECT_THAT(Describe(grpc::StatusCode::NOT_FOUND, "node 9"),
              StartsWith("NOT_FOUND: node 9 ("));
  EXPECT_THAT(Describe(grpc::StatusCode::RESOURCE_EXHAUSTED, "big"),
              HasSubstr("--limit"));
  EXPECT_THAT(Describe(grpc::StatusCode::UNIMPLEMENTED, "?"),
              HasSubstr("upgrade hicached"));
  EXPECT_EQ(Describe(grpc::StatusCode::INTERNAL, "boom"), "INTERNAL: boom");
  EXPECT_THAT(Describe(grpc::StatusCode::UNAVAILABLE, "refused"),
              HasSubstr("UNAVAILABLE: cannot reach a daemon at host:1: "
                        "refused"));
}

TEST(RpcErrorTest, UnavailableUnixSocketSaysWhetherItExists) {
  testing::TempDir dir;
  const std::string missing = dir.Child("none.sock");
  EXPECT_EQ(Describe(grpc::StatusCode::UNAVAILABLE, "connect failed", missing),
            "UNAVAILABLE: no daemon at " + missing +
                " (no such socket); is hicached running? check --socket or "
                "--target (or HICACHE_SOCKET, HICACHE_TARGET)");
  // Reads retry on UNAVAILABLE until the deadline: the same advice.
  EXPECT_EQ(Describe(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline", missing),
            "DEADLINE_EXCEEDED: no daemon at " + missing +
                " (no such socket); is hicached running? check --socket or "
                "--target (or HICACHE_SOCKET, HICACHE_TARGET)");
  // Something there that is not a socket: said so.
  EXPECT_EQ(
      Describe(grpc::StatusCode::UNAVAILABLE, "connect failed", dir.path()),
      "UNAVAILABLE: " + dir.path() + " is not a socket: check --socket");
  // A socket that is there but answers nobody (stale): gRPC's reason kept.
  const std::string stale = dir.Child("stale.sock");
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", stale.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  EXPECT_EQ(
      Describe(grpc::StatusCode::UNAVAILABLE, "Connection refused", stale),
      "UNAVAILABLE: no daemon answering at " + stale +
          " (Connection refused); is hicached running? check --socket "
          "or --target (or HICACHE_SOCKET, HICACHE_TARGET)");
}

// A follower that answered but does not know its leader yet is not "no
// daemon" (it was once reported so over a unix socket).
TEST(RpcErrorTest, AFollowerWithoutALeaderYetIsNotAMissingDaemon) {
  testing::TempDir dir;
  const std::string message =
      "MatchPrefix: not the CP group leader, and the leader is not known "
      "yet; try again";
  EXPECT_EQ(Describe(grpc::StatusCode::UNAVAILABLE, message, dir.path()),
            "UNAVAILABLE: " + message +
                " (this daemon is a CP group follower that does not know its "
                "leader yet; retry, or use --target with the leader's "
                "address)");
}

TEST(RpcErrorTest, AFollowerNamesItsLeader) {
  const grpc::Status refused(grpc::StatusCode::FAILED_PRECONDITION,
                             "not the CP group leader");
  EXPECT_EQ(DescribeRpcError(refused, "unix:/s", "", absl::Seconds(5),
                             "10.0.0.1:7070"),
            "FAILED_PRECONDITION: not the CP group leader (this daemon is a "
            "CP group follower; the leader is 10.0.0.1:7070 (use --target "
            "10.0.0.1:7070))");
  // No leader, or one that is no valid target: no hint.
  EXPECT_EQ(DescribeRpcError(refused, "unix:/s", "", absl::Seconds(5)),
            "FAILED_PRECONDITION: not the CP group leader");
  for (const std::string garbage :
       {"unix:/tmp/evil.sock", "host:0", "a\nb:1", "-x:1", "host"}) {
    EXPECT_EQ(DescribeRpcError(refused, "unix:/s", "", absl::Seconds(5),
                               garbage),
              "FAILED_PRECONDITION: not the CP group leader")
        << garbage;
  }
  // Only a FAILED_PRECONDITION carries it.
  EXPECT_THAT(DescribeRpcError(grpc::Status(grpc::StatusCode::INTERNAL, "x"),
                               "unix:/s", "", absl::Seconds(5),
                               "10.0.0.1:7070"),
              Not(HasSubstr("follower")));
}

}  // namespace
}  // namespace hicache::ctl
