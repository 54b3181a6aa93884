// Round-trip cost of the daemon's process hop: unary RPCs over the real unix
// socket to an in-process DaemonServer. Baseline for the service issue's
// "the extra hop must cost little beyond the transport".
//
//   bazel run --config=opt //bench:rpc_bench -- --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "benchmark/benchmark.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"
#include "daemon/core/clock.h"
#include "daemon/main/daemon_server.h"

namespace hicache {
namespace {

class ServerFixture {
 public:
  ServerFixture() {
    char pattern[] = "/tmp/hicache-bench-XXXXXX";
    dir_ = mkdtemp(pattern);
    socket_ = dir_ + "/d.sock";
    auto server = DaemonServer::Start(DaemonConfig(), socket_, Clock::Real());
    if (!server.ok()) abort();
    server_ = *std::move(server);
    auto client = client::HiCacheClient::Create(client::UnixTarget(socket_));
    if (!client.ok()) abort();
    client_ = *std::move(client);
    if (!client_->WaitForConnected(absl::Seconds(5)).ok()) abort();
  }
  ~ServerFixture() {
    client_.reset();
    server_.reset();
    rmdir(dir_.c_str());
  }
  client::HiCacheClient& client() { return *client_; }

 private:
  std::string dir_;
  std::string socket_;
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<client::HiCacheClient> client_;
};

ServerFixture& Fixture() {
  static ServerFixture* fixture = new ServerFixture();
  return *fixture;
}

void BM_GetStats(benchmark::State& state) {
  client::HiCacheClient& client = Fixture().client();
  for (auto _ : state) {
    auto stats = client.GetStats();
    if (!stats.ok()) state.SkipWithError("GetStats failed");
    benchmark::DoNotOptimize(stats);
  }
}
BENCHMARK(BM_GetStats)->UseRealTime();

void BM_HealthCheck(benchmark::State& state) {
  client::HiCacheClient& client = Fixture().client();
  for (auto _ : state) {
    auto health = client.CheckHealth();
    if (!health.ok()) state.SkipWithError("health check failed");
    benchmark::DoNotOptimize(health);
  }
}
BENCHMARK(BM_HealthCheck)->UseRealTime();

}  // namespace
}  // namespace hicache
