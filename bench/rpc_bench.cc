// Round-trip cost of the daemon's process hop: unary RPCs over the real unix
// socket to an in-process DaemonServer. Baseline for the service issue's
// "the extra hop must cost little beyond the transport".
//
//   bazel run --config=opt //bench:rpc_bench -- --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "bench/latencies.h"
#include "benchmark/benchmark.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"
#include "client/cpp/hicache_session.h"
#include "daemon/core/clock.h"
#include "daemon/main/daemon_server.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"

namespace hicache {
namespace {

class ServerFixture {
 public:
  ServerFixture() {
    char pattern[] = "/tmp/hicache-bench-XXXXXX";
    dir_ = mkdtemp(pattern);
    socket_ = dir_ + "/d.sock";
    DaemonConfig config;
    config.device_pages_per_rank = 4096;
    config.host_pages_per_rank = 4096;
    auto server = DaemonServer::Start(config, socket_, Clock::Real());
    if (!server.ok()) abort();
    server_ = *std::move(server);
    auto client = client::HiCacheClient::Create(client::UnixTarget(socket_));
    if (!client.ok()) abort();
    client_ = *std::move(client);
    if (!client_->WaitForConnected(absl::Seconds(5)).ok()) abort();
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
    session_ = *client::Session::Open(stub_, "bench", v1::ROLE_SCHEDULER, 0, "",
                                      absl::Minutes(10));
    // Cache one 16K-token request (256 pages at P = 64).
    tokens_.resize(16384);
    for (size_t i = 0; i < tokens_.size(); ++i) tokens_[i] = 100000 + i;
    v1::AllocateItem item;
    item.set_num_pages(256);
    auto pages = *session_->Allocate({item});
    v1::InsertRequest insert;
    insert.add_items()->set_tokens(client::PackTokens(tokens_));
    *insert.mutable_items(0)->mutable_pages() = pages.allocations(0).pages();
    if (!session_->Insert(insert).ok()) abort();
    match_.set_session_id(session_->id());
    match_.add_items()->set_tokens(client::PackTokens(tokens_));
    keep_alive_.set_session_id(session_->id());
    // The same 64 KiB of tokens to a namespace with no tree: the transport and
    // decoding cost of the payload with no cache work (the floor for the hit).
    empty_session_ =
        *client::Session::Open(stub_, "bench-empty", v1::ROLE_SCHEDULER, 0,
                               "empty-namespace", absl::Minutes(10));
    miss_.set_session_id(empty_session_->id());
    miss_.add_items()->set_tokens(client::PackTokens(tokens_));
    // 64 short requests (one 512-token block each, half of them cached).
    batch_.set_session_id(session_->id());
    for (int i = 0; i < 64; ++i) {
      std::vector<int32_t> block(tokens_.begin() + (i % 32) * 512,
                                 tokens_.begin() + (i % 32) * 512 + 512);
      if (i % 2) block[0] = -1;  // A miss.
      batch_.add_items()->set_tokens(client::PackTokens(block));
    }
  }
  v1::HiCache::Stub& stub() { return *stub_; }
  const v1::MatchPrefixRequest& match() const { return match_; }
  const v1::MatchPrefixRequest& batch() const { return batch_; }
  const v1::KeepAliveRequest& keep_alive() const { return keep_alive_; }
  const v1::MatchPrefixRequest& miss() const { return miss_; }
  ~ServerFixture() {
    empty_session_.reset();
    session_.reset();
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
  std::shared_ptr<v1::HiCache::Stub> stub_;
  std::unique_ptr<client::Session> session_;
  std::unique_ptr<client::Session> empty_session_;
  v1::MatchPrefixRequest miss_;
  std::vector<int32_t> tokens_;
  v1::MatchPrefixRequest match_;
  v1::MatchPrefixRequest batch_;
  v1::KeepAliveRequest keep_alive_;
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

// The floor: an RPC that does nothing (KeepAlive).
void BM_EmptyRpc(benchmark::State& state) {
  ServerFixture& f = Fixture();
  Latencies latencies;
  for (auto _ : state) {
    const grpc::Status status = latencies.Time([&] {
      grpc::ClientContext ctx;
      v1::KeepAliveResponse response;
      return f.stub().KeepAlive(&ctx, f.keep_alive(), &response);
    });
    if (!status.ok()) state.SkipWithError("KeepAlive failed");
  }
  latencies.Report(state);
}
BENCHMARK(BM_EmptyRpc)->UseRealTime();

// Times one unary MatchPrefix per iteration; `expected` valid device tokens.
void TimeMatch(benchmark::State& state, const v1::MatchPrefixRequest& request,
               int64_t expected) {
  ServerFixture& f = Fixture();
  Latencies latencies;
  for (auto _ : state) {
    v1::MatchPrefixResponse response;
    const grpc::Status status = latencies.Time([&] {
      grpc::ClientContext ctx;
      return f.stub().MatchPrefix(&ctx, request, &response);
    });
    if (!status.ok() ||
        response.results(0).device().valid_tokens() != expected) {
      state.SkipWithError("MatchPrefix failed");
    }
  }
  latencies.Report(state);
}

// MatchPrefix of one 16K-token request (64 KiB of tokens), a full hit.
void BM_MatchPrefix16K(benchmark::State& state) {
  TimeMatch(state, Fixture().match(), 16384);
}
BENCHMARK(BM_MatchPrefix16K)->UseRealTime();

// The same payload with nothing to match: transport and decoding only.
void BM_SamePayloadNoMatch16K(benchmark::State& state) {
  TimeMatch(state, Fixture().miss(), 0);
}
BENCHMARK(BM_SamePayloadNoMatch16K)->UseRealTime();

// 64 requests per call; items/s counts matched requests.
void BM_BatchedMatch64(benchmark::State& state) {
  ServerFixture& f = Fixture();
  for (auto _ : state) {
    grpc::ClientContext ctx;
    v1::MatchPrefixResponse response;
    if (!f.stub().MatchPrefix(&ctx, f.batch(), &response).ok()) {
      state.SkipWithError("MatchPrefix failed");
    }
  }
  state.SetItemsProcessed(state.iterations() * 64);
}
BENCHMARK(BM_BatchedMatch64)->UseRealTime()->Threads(1)->Threads(4);

}  // namespace
}  // namespace hicache
