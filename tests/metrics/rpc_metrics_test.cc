// RpcMetrics, alone and behind RpcInterceptorFactory in a real gRPC server
// (the standard health service over loopback TCP).
#include "daemon/metrics/rpc_metrics.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/metrics/rpc_interceptor.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace hicache::metrics {
namespace {

// The value of `name` whose labels include all of `labels` (-1 if none).
double Sample(prometheus::Registry& registry, const std::string& name,
              const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> have;
      for (const auto& label : metric.label) have[label.name] = label.value;
      bool match = true;
      for (const auto& [k, v] : labels) match &= have.count(k) && have[k] == v;
      if (!match) continue;
      if (family.name == name) {
        switch (family.type) {
          case prometheus::MetricType::Counter:
            return metric.counter.value;
          case prometheus::MetricType::Gauge:
            return metric.gauge.value;
          default:
            break;
        }
      }
      if (family.name + "_count" == name) {
        return static_cast<double>(metric.histogram.sample_count);
      }
    }
  }
  return -1;
}

TEST(RpcMetricsTest, CountsAndTimesKnownMethods) {
  prometheus::Registry registry;
  RpcMetrics metrics(registry, {"/pkg.Svc/Get", "/pkg.Svc/Stream"});
  RpcMetrics::Call call = metrics.Begin("/pkg.Svc/Get");
  EXPECT_EQ(Sample(registry, "hicache_rpcs_in_flight",
                   {{"service", "pkg.Svc"}, {"method", "Get"}}),
            1);
  metrics.End(call, 0, absl::Milliseconds(3));
  metrics.End(metrics.Begin("/pkg.Svc/Get"), 3, absl::Milliseconds(1));
  EXPECT_EQ(Sample(registry, "hicache_rpcs_in_flight",
                   {{"service", "pkg.Svc"}, {"method", "Get"}}),
            0);
  EXPECT_EQ(Sample(registry, "hicache_rpcs_total",
                   {{"method", "Get"}, {"code", "OK"}}),
            1);
  EXPECT_EQ(Sample(registry, "hicache_rpcs_total",
                   {{"method", "Get"}, {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(Sample(registry, "hicache_rpc_duration_seconds_count",
                   {{"method", "Get"}, {"code", "OK"}}),
            1);
  // An open stream shows in flight.
  metrics.Begin("/pkg.Svc/Stream");
  EXPECT_EQ(Sample(registry, "hicache_rpcs_in_flight", {{"method", "Stream"}}),
            1);
}

TEST(RpcMetricsTest, UnknownPathsShareOneSeries) {
  prometheus::Registry registry;
  RpcMetrics metrics(registry, {"/pkg.Svc/Get"});
  for (int i = 0; i < 100; ++i) {
    const std::string path = "/evil.Svc/M" + std::to_string(i);
    metrics.End(metrics.Begin(path.c_str()), 12, absl::Microseconds(5));
  }
  metrics.End(metrics.Begin(nullptr), 12, absl::Microseconds(5));
  EXPECT_EQ(Sample(registry, "hicache_rpcs_total",
                   {{"service", "unknown"}, {"method", "unknown"},
                    {"code", "UNIMPLEMENTED"}}),
            101);
  size_t series = 0;
  for (const auto& family : registry.Collect()) series += family.metric.size();
  // In flight: Get and unknown; total and duration: one each.
  EXPECT_EQ(series, 4u);
}

TEST(RpcMetricsTest, ConcurrentCallsAreAllCounted) {
  prometheus::Registry registry;
  RpcMetrics metrics(registry, {"/pkg.Svc/Get"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int i = 0; i < 1000; ++i) {
        metrics.End(metrics.Begin("/pkg.Svc/Get"), (t + i) % 2 == 0 ? 0 : 14,
                    absl::Microseconds(i));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(Sample(registry, "hicache_rpcs_total",
                   {{"method", "Get"}, {"code", "OK"}}),
            4000);
  EXPECT_EQ(Sample(registry, "hicache_rpc_duration_seconds_count",
                   {{"method", "Get"}, {"code", "UNAVAILABLE"}}),
            4000);
  EXPECT_EQ(Sample(registry, "hicache_rpcs_in_flight", {{"method", "Get"}}), 0);
}

TEST(RpcMetricsTest, CodeNames) {
  EXPECT_EQ(RpcMetrics::CodeName(0), "OK");
  EXPECT_EQ(RpcMetrics::CodeName(5), "NOT_FOUND");
  EXPECT_EQ(RpcMetrics::CodeName(16), "UNAUTHENTICATED");
  EXPECT_EQ(RpcMetrics::CodeName(17), "CODE_17");
}

TEST(RpcMetricsTest, BucketsAscend) {
  const std::vector<double>& buckets = RpcMetrics::Buckets();
  EXPECT_TRUE(std::is_sorted(buckets.begin(), buckets.end()));
  EXPECT_LE(buckets.front(), 0.0001);
  EXPECT_GE(buckets.back(), 10);
}

TEST(RpcInterceptorTest, ARealServerCountsEveryCallWithItsCode) {
  prometheus::Registry registry;
  RpcMetrics metrics(registry, {"/grpc.health.v1.Health/Check"});
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  std::vector<std::unique_ptr<
      grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<RpcInterceptorFactory>(&metrics));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  server->GetHealthCheckService()->SetServingStatus("known", true);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  auto call = [&](const std::string& method, const std::string& service) {
    // grpc.health.v1.HealthCheckRequest{service}: field 1, length-delimited.
    std::string request = std::string("\x0a") +
                          static_cast<char>(service.size()) + service;
    grpc::Slice slice(request);
    grpc::ByteBuffer in(&slice, 1), out;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &in, &out,
                   [&](grpc::Status s) {
                     std::lock_guard<std::mutex> lock(mu);
                     status = s;
                     done = true;
                     cv.notify_all();
                   });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status.error_code();
  };
  EXPECT_EQ(call("/grpc.health.v1.Health/Check", "known"), grpc::OK);
  EXPECT_EQ(call("/grpc.health.v1.Health/Check", "known"), grpc::OK);
  EXPECT_EQ(call("/grpc.health.v1.Health/Check", "nope"), grpc::NOT_FOUND);
  EXPECT_EQ(call("/no.Such/Method", ""), grpc::UNIMPLEMENTED);
  server->Shutdown();
  server->Wait();

  EXPECT_EQ(Sample(registry, "hicache_rpcs_total",
                   {{"service", "grpc.health.v1.Health"},
                    {"method", "Check"},
                    {"code", "OK"}}),
            2);
  EXPECT_EQ(Sample(registry, "hicache_rpcs_total",
                   {{"method", "Check"}, {"code", "NOT_FOUND"}}),
            1);
  EXPECT_EQ(Sample(registry, "hicache_rpc_duration_seconds_count",
                   {{"method", "Check"}, {"code", "OK"}}),
            2);
  EXPECT_EQ(Sample(registry, "hicache_rpcs_in_flight", {{"method", "Check"}}),
            0);
  // No series carries the unknown path.
  for (const auto& family : registry.Collect()) {
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        EXPECT_EQ(label.value.find("Such"), std::string::npos);
      }
    }
  }
}

}  // namespace
}  // namespace hicache::metrics
