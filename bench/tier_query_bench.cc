// Two-process benchmark of the router query (QueryTiers; docs/kv-events.md):
// a router's batched call against a real hicached process.
//
//   bazel run --config=opt //bench:tier_query_bench --
//       [--socket=PATH]          use a running daemon (operator access)
//       [--sequences=4096 --tokens=1024 --benchmark_repetitions=3]
//
// The daemon (spawned: CPU backend, P = 64) caches --sequences sequences of
// --tokens tokens (conversation-like: one of 64 shared system prompts of a
// quarter of the tokens, then each its own). BM_QueryTiers/B: one call of B
// sequences per iteration, half of them cached, half unknown past their
// shared prompt. Counters: sequences_per_s (over the whole run), median_us
// and p99_us per call. Goal: >= 100k sequences/s batched.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/latencies.h"
#include "bench/spawned_daemon.h"
#include "benchmark/benchmark.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/create_channel.h"

ABSL_FLAG(std::string, socket, "", "A running daemon's socket; empty: spawn.");
ABSL_FLAG(std::string, daemon, "", "hicached to spawn; empty: the runfile.");
ABSL_FLAG(int, sequences, 4096, "Sequences cached.");
ABSL_FLAG(int, tokens, 1024, "Tokens per sequence (a multiple of 64).");

namespace hicache {
namespace {

constexpr int kPage = 64;

struct Env {
  std::unique_ptr<bench::SpawnedDaemon> daemon;
  std::unique_ptr<v1::HiCache::Stub> stub;
  std::vector<std::string> cached;   // Packed tokens.
  std::vector<std::string> unknown;  // A shared prompt, then new tokens.
};
Env* env = nullptr;

std::vector<int32_t> Sequence(int i, bool known, std::mt19937& rng) {
  const int n = absl::GetFlag(FLAGS_tokens);
  std::vector<int32_t> tokens(n);
  const int prompt = n / 4;
  for (int t = 0; t < prompt; ++t) tokens[t] = 1000000 * (i % 64) + t;
  for (int t = prompt; t < n; ++t) {
    tokens[t] = known ? 100000000 + i * n + t : static_cast<int32_t>(rng() >> 1);
  }
  return tokens;
}

absl::Status SetUp(const char* argv0) {
  env = new Env();
  const int n = absl::GetFlag(FLAGS_tokens);
  const int count = absl::GetFlag(FLAGS_sequences);
  const int64_t pages = int64_t{count} * (n / kPage) + 1024;
  auto daemon = bench::SpawnedDaemon::Start(
      argv0, "tiers", absl::GetFlag(FLAGS_socket), absl::GetFlag(FLAGS_daemon),
      {absl::StrCat("--page_size=", kPage), "--kv_preset=micro",
       absl::StrCat("--device_pages_per_rank=", pages),
       absl::StrCat("--host_pages_per_rank=", pages)});
  if (!daemon.ok()) return daemon.status();
  env->daemon = *std::move(daemon);
  auto channel = grpc::CreateChannel(client::UnixTarget(env->daemon->socket()),
                                     grpc::InsecureChannelCredentials());
  std::shared_ptr<v1::HiCache::Stub> shared = v1::HiCache::NewStub(channel);
  env->stub = v1::HiCache::NewStub(channel);
  auto session = client::Session::Open(shared, "tier-bench", v1::ROLE_SCHEDULER,
                                       0, "", absl::Seconds(30),
                                       absl::Seconds(20));
  if (!session.ok()) return session.status();
  std::mt19937 rng(1);
  for (int i = 0; i < count; ++i) {
    const std::vector<int32_t> tokens = Sequence(i, true, rng);
    v1::AllocateItem item;
    item.set_num_pages(n / kPage);
    auto allocated = (*session)->Allocate({item});
    if (!allocated.ok()) return allocated.status();
    v1::InsertRequest insert;
    insert.add_items()->set_tokens(client::PackTokens(tokens));
    *insert.mutable_items(0)->mutable_pages() =
        allocated->allocations(0).pages();
    if (auto inserted = (*session)->Insert(insert); !inserted.ok()) {
      return inserted.status();
    }
    env->cached.push_back(client::PackTokens(tokens));
    env->unknown.push_back(client::PackTokens(Sequence(i, false, rng)));
  }
  return absl::OkStatus();
}

void BM_QueryTiers(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  std::mt19937 rng(2);
  Latencies calls;
  int64_t sequences = 0, hit_tokens = 0;
  for (auto _ : state) {
    v1::QueryTiersRequest request;
    for (int i = 0; i < batch; ++i) {
      const size_t k = rng() % env->cached.size();
      request.add_queries()->set_tokens(i % 2 == 0 ? env->cached[k]
                                                   : env->unknown[k]);
    }
    v1::QueryTiersResponse response;
    const grpc::Status status = calls.Time([&] {
      grpc::ClientContext ctx;
      return env->stub->QueryTiers(&ctx, request, &response);
    });
    if (!status.ok()) {
      state.SkipWithError(status.error_message().c_str());
      return;
    }
    sequences += batch;
    for (const v1::TierHit& hit : response.hits()) {
      hit_tokens += hit.device_tokens() + hit.host_tokens();
    }
  }
  state.counters["sequences_per_s"] =
      benchmark::Counter(static_cast<double>(sequences),
                         benchmark::Counter::kIsRate);
  state.counters["hit_tokens_per_seq"] =
      static_cast<double>(hit_tokens) / static_cast<double>(sequences);
  calls.Report(state);
}
BENCHMARK(BM_QueryTiers)->Arg(1)->Arg(64)->Arg(1024)->UseRealTime();

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = hicache::SetUp(argv[0]); !s.ok()) {
    std::fprintf(stderr, "tier_query_bench: %s\n",
                 std::string(s.message()).c_str());
    delete hicache::env;
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete hicache::env;
  return 0;
}
