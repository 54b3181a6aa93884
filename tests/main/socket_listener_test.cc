// SocketListener, on both transports (the unix socket and TCP): real
// sockets and a real gRPC server; accept(2) failures are substituted
// through Options::accept.
#include "daemon/main/socket_listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using Acceptor = grpc::experimental::ExternalConnectionAcceptor;

enum class Transport { kUnix, kTcp };

class SocketListenerTest : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    if (tcp()) {
      // Connections accepted by the listener, given to gRPC with server
      // credentials (insecure here; the daemon passes its TLS ones).
      acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::
              FROM_FD,
          grpc::InsecureServerCredentials());
    }
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  bool tcp() const { return GetParam() == Transport::kTcp; }

  absl::StatusOr<std::unique_ptr<SocketListener>> Bind(
      SocketListener::Options options = {}) {
    auto listener = tcp() ? SocketListener::BindTcp("127.0.0.1:0", options,
                                                    &registry_)
                          : SocketListener::BindUnix(path_, options,
                                                     &registry_);
    if (listener.ok()) port_ = (*listener)->port();
    return listener;
  }
  void Start(SocketListener& listener) {
    if (!tcp()) return listener.Start(server_.get());
    Acceptor* acceptor = acceptor_.get();
    listener.Start([acceptor](int listener_fd, int fd) {
      Acceptor::NewConnectionParameters p;
      p.listener_fd = listener_fd;
      p.fd = fd;
      acceptor->HandleNewConnection(&p);
    });
  }

  std::string Target() const {
    return tcp() ? "127.0.0.1:" + std::to_string(port_) : "unix:" + path_;
  }
  // A health check on a fresh channel, waiting for the server up to
  // `deadline`; true when it answered.
  bool Healthy(absl::Duration deadline = absl::Seconds(30)) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // A connection of its own.
    auto channel = grpc::CreateCustomChannel(
        Target(), grpc::InsecureChannelCredentials(), args);
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    return stub->Check(&context, request, &response).ok();
  }
  // A raw connection (no gRPC), or -1.
  int Connect() const {
    int fd = -1;
    if (tcp()) {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port_));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        return fd;
      }
    } else {
      fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        return fd;
      }
    }
    close(fd);
    return -1;
  }

  testing::TempDir dir_;
  const std::string path_ = dir_.Child("l.sock");
  int port_ = 0;
  ConnectionRegistry registry_{OperatorPolicy{}};
  std::unique_ptr<Acceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
};

INSTANTIATE_TEST_SUITE_P(Transports, SocketListenerTest,
                         ::testing::Values(Transport::kUnix, Transport::kTcp),
                         [](const auto& info) {
                           return info.param == Transport::kTcp ? "Tcp"
                                                                : "Unix";
                         });

TEST_P(SocketListenerTest, ServesConnections) {
  auto listener = Bind();
  ASSERT_TRUE(listener.ok()) << listener.status();
  if (tcp()) {
    EXPECT_GT((*listener)->port(), 0);
  }
  Start(**listener);
  EXPECT_TRUE(Healthy());
  EXPECT_EQ(registry_.size(), 1u);
  (*listener)->Stop();
}

// Past max_connections a connection is accepted and closed at once; the
// one that is open goes on, and once it closes another is served.
TEST_P(SocketListenerTest, ConnectionCapRefusesOneMore) {
  auto listener = Bind({.max_connections = 1});
  ASSERT_TRUE(listener.ok()) << listener.status();
  Start(**listener);
  const int held = Connect();  // Takes the one slot.
  ASSERT_GE(held, 0);
  const int refused = Connect();
  ASSERT_GE(refused, 0);
  char byte;
  // The listener closes the refused one: EOF once it got to it (reading
  // blocks until then; the held one is open and stays silent).
  EXPECT_EQ(read(refused, &byte, 1), 0);
  close(refused);
  close(held);  // gRPC closes its end; the registry's count drops.
  EXPECT_TRUE(Healthy());
  // Counted before the accept thread took the health check's connection.
  EXPECT_GE((*listener)->refused(), 1);
  (*listener)->Stop();
}

// Out of descriptors (EMFILE): the pending connection is taken with the
// spare descriptor and closed, and the listener goes on serving (gRPC's own
// TCP acceptor stops for good after an EMFILE).
TEST_P(SocketListenerTest, DescriptorExhaustionShedsThePendingConnection) {
  std::atomic<bool> exhausted{true};
  SocketListener::Options options;
  options.accept = [&exhausted](int fd, int flags) {
    // The loop's accept (non-blocking connections) fails once; ShedOne's
    // own accept works.
    if ((flags & SOCK_NONBLOCK) != 0 && exhausted.exchange(false)) {
      errno = EMFILE;
      return -1;
    }
    return accept4(fd, nullptr, nullptr, flags);
  };
  auto listener = Bind(options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  Start(**listener);
  const int shed = Connect();
  ASSERT_GE(shed, 0);
  char byte;
  EXPECT_EQ(read(shed, &byte, 1), 0);  // Accepted and closed.
  close(shed);
  EXPECT_TRUE(Healthy());  // And serving again.
  // Counted before the accept thread took the health check's connection.
  EXPECT_EQ((*listener)->refused(), 1);
  (*listener)->Stop();
}

// ENOBUFS/ENOMEM are the kernel running short: the loop retries, and the
// pending connection is served once accept works again.
TEST_P(SocketListenerTest, TransientMemoryFailuresAreRetried) {
  std::atomic<int> failures{0};
  std::atomic<int> fatal{0};
  SocketListener::Options options;
  options.accept = [&failures](int fd, int flags) {
    const int n = failures.fetch_add(1);
    if (n < 3) {
      errno = n % 2 == 0 ? ENOBUFS : ENOMEM;
      return -1;
    }
    return accept4(fd, nullptr, nullptr, flags);
  };
  options.on_fatal = [&fatal](const absl::Status&) { ++fatal; };
  auto listener = Bind(options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  Start(**listener);
  EXPECT_TRUE(Healthy());
  EXPECT_GE(failures.load(), 4);
  (*listener)->Stop();
  EXPECT_EQ(fatal.load(), 0);
}

// A listening socket that is broken (EBADF, EINVAL, ...) cannot recover: the
// loop ends and reports it once, so the daemon stops instead of staying up
// without taking connections (the bug: it only logged and kept running).
TEST_P(SocketListenerTest, PermanentFailureIsReportedOnce) {
  absl::Notification reported;
  std::vector<absl::Status> statuses;
  SocketListener::Options options;
  options.accept = [](int, int) {
    errno = EBADF;
    return -1;
  };
  options.on_fatal = [&](const absl::Status& status) {
    statuses.push_back(status);
    reported.Notify();
  };
  auto listener = Bind(options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  Start(**listener);
  reported.WaitForNotification();
  (*listener)->Stop();  // The loop has ended; Stop() still returns.
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(statuses[0])) << statuses[0];
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr("Bad file descriptor"));
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr(tcp() ? "TCP 127.0.0.1:0" : "the unix socket"));
}

// Stop() makes accept() fail too; that is not a failure to report.
TEST_P(SocketListenerTest, StopIsNotAFailure) {
  std::atomic<int> fatal{0};
  SocketListener::Options options;
  options.on_fatal = [&fatal](const absl::Status&) { ++fatal; };
  auto listener = Bind(options);
  ASSERT_TRUE(listener.ok()) << listener.status();
  Start(**listener);
  (*listener)->Stop();
  EXPECT_EQ(fatal.load(), 0);
}

TEST(SocketListenerTcpTest, BadAddressesAreRefused) {
  ConnectionRegistry registry{OperatorPolicy{}};
  for (const char* bad : {"nocolon", "127.0.0.1:99999", "127.0.0.1:x",
                          "[::1:80", "no.such.host.invalid:80"}) {
    auto listener = SocketListener::BindTcp(bad, {}, &registry);
    EXPECT_FALSE(listener.ok()) << bad;
  }
}

}  // namespace
}  // namespace hicache
