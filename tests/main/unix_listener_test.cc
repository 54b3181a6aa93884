// UnixListener: real sockets and a real gRPC server; accept(2) failures are
// substituted through Options::accept.
#include "daemon/main/unix_listener.h"

#include <errno.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

class UnixListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  // A health check over the unix socket; true when the server answered.
  bool Healthy() {
    auto channel = grpc::CreateChannel("unix:" + path_,
                                       grpc::InsecureChannelCredentials());
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    return stub->Check(&context, request, &response).ok();
  }

  testing::TempDir dir_;
  const std::string path_ = dir_.Child("l.sock");
  ConnectionRegistry registry_{OperatorPolicy{}};
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(UnixListenerTest, ServesConnections) {
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Bind(path_, {}, &registry_);
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start(server_.get());
  EXPECT_TRUE(Healthy());
  (*listener)->Stop();
}

// ENOBUFS/ENOMEM are the kernel running short: the loop retries, and the
// pending connection is served once accept works again.
TEST_F(UnixListenerTest, TransientMemoryFailuresAreRetried) {
  std::atomic<int> failures{0};
  std::atomic<int> fatal{0};
  UnixListener::Options options;
  options.accept = [&failures](int fd, int flags) {
    const int n = failures.fetch_add(1);
    if (n < 3) {
      errno = n % 2 == 0 ? ENOBUFS : ENOMEM;
      return -1;
    }
    return accept4(fd, nullptr, nullptr, flags);
  };
  options.on_fatal = [&fatal](const absl::Status&) { ++fatal; };
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Bind(path_, options, &registry_);
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start(server_.get());
  EXPECT_TRUE(Healthy());
  EXPECT_GE(failures.load(), 4);
  (*listener)->Stop();
  EXPECT_EQ(fatal.load(), 0);
}

// A listening socket that is broken (EBADF, EINVAL, ...) cannot recover: the
// loop ends and reports it once, so the daemon stops instead of staying up
// without taking connections (the bug: it only logged and kept running).
TEST_F(UnixListenerTest, PermanentFailureIsReportedOnce) {
  absl::Notification reported;
  std::vector<absl::Status> statuses;
  UnixListener::Options options;
  options.accept = [](int, int) {
    errno = EBADF;
    return -1;
  };
  options.on_fatal = [&](const absl::Status& status) {
    statuses.push_back(status);
    reported.Notify();
  };
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Bind(path_, options, &registry_);
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start(server_.get());
  ASSERT_TRUE(reported.WaitForNotificationWithTimeout(absl::Seconds(10)));
  (*listener)->Stop();  // The loop has ended; Stop() still returns.
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_TRUE(absl::IsUnavailable(statuses[0])) << statuses[0];
  EXPECT_THAT(std::string(statuses[0].message()),
              HasSubstr("Bad file descriptor"));
}

// Stop() makes accept() fail too; that is not a failure to report.
TEST_F(UnixListenerTest, StopIsNotAFailure) {
  std::atomic<int> fatal{0};
  UnixListener::Options options;
  options.on_fatal = [&fatal](const absl::Status&) { ++fatal; };
  absl::StatusOr<std::unique_ptr<UnixListener>> listener =
      UnixListener::Bind(path_, options, &registry_);
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start(server_.get());
  (*listener)->Stop();
  EXPECT_EQ(fatal.load(), 0);
}

}  // namespace
}  // namespace hicache
