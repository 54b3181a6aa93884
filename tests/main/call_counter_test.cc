// CallCounter behind a real gRPC server: it counts calls in progress
// (a held stream included) and WaitIdle returns when the last one ends or at
// its deadline.
#include "daemon/main/call_counter.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(CallCounterTest, CountsCallsAndWaitsForIdle) {
  std::shared_ptr<CallCounter> calls = CallCounter::Create();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  std::vector<std::unique_ptr<
      grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(calls->MakeFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));

  // A unary call comes and goes.
  {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(stub->Check(&context, request, &response).ok());
  }
  EXPECT_TRUE(calls->WaitIdle(absl::Now() + absl::Seconds(10)));

  // A Watch stream stays in progress until it is cancelled.
  grpc::ClientContext watch_context;
  grpc::health::v1::HealthCheckRequest request;
  auto reader = stub->Watch(&watch_context, request);
  grpc::health::v1::HealthCheckResponse first;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_EQ(calls->in_progress(), 1);
  const absl::Time start = absl::Now();
  EXPECT_FALSE(calls->WaitIdle(absl::Now() + absl::Milliseconds(200)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(100));
    watch_context.TryCancel();
  });
  EXPECT_TRUE(calls->WaitIdle(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(calls->in_progress(), 0);
  cancel.join();
  (void)reader->Finish();
  server->Shutdown();
}

}  // namespace
}  // namespace hicache
