// Throughput of the KV-event publisher (docs/kv-events.md): events handed
// to it as the radix tree does (OnTierEvent, under what would be the
// engine's lock), encoded in vLLM's format and sent on a PUB socket to a
// subscriber thread that reads every batch.
//
//   bazel run --config=opt //bench:kv_event_bench -- --benchmark_repetitions=3
//
// BM_Publish/B: one event of B blocks of 16 tokens per call (BlockStored
// and BlockRemoved alternating, one topic); an iteration is 10,000 calls,
// then a Flush (every event sent). Counters: events_per_s and blocks_per_s
// through the whole pipeline; call_ns, the caller's cost per event (what
// the engine's lock holds). Goal: >= 500k events/s.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "daemon/events/kv_event_publisher.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace hicache::events {
namespace {

constexpr int kCalls = 10000;
constexpr uint32_t kBlock = 16;

void BM_Publish(benchmark::State& state) {
  const int blocks = static_cast<int>(state.range(0));
  char dir[] = "/tmp/hicache-kv-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    state.SkipWithError("mkdtemp");
    return;
  }
  KvEventPublisherOptions options;
  options.endpoint = std::string("ipc://") + dir + "/events";
  options.format.block_size = kBlock;
  options.topics.instance = "bench";
  options.max_queued_events = 1 << 22;
  options.hwm = 1 << 22;
  auto publisher = KvEventPublisher::Create(options);
  if (!publisher.ok()) {
    state.SkipWithError(std::string(publisher.status().message()).c_str());
    return;
  }
  // The subscriber (a router): reads every batch.
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvhwm, 1 << 22);
  sub.set(zmq::sockopt::rcvtimeo, 100);
  sub.connect((*publisher)->endpoint());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> received{0};
  std::thread reader([&] {
    while (!stop.load()) {
      std::vector<zmq::message_t> frames;
      if (zmq::recv_multipart(sub, std::back_inserter(frames))) {
        received.fetch_add(1);
      }
    }
  });
  std::vector<uint64_t> hashes(blocks);
  std::vector<int32_t> tokens(blocks * kBlock);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 1000 + 37 * i;
  const std::vector<absl::Span<const int32_t>> pieces = {tokens};
  uint64_t next = 1;
  double call_ns = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < kCalls; ++c) {
      TierEvent event;
      event.ns = "bench";
      event.tier = Tier::kDevice;
      for (uint64_t& h : hashes) h = next++;
      event.block_hashes = hashes;
      if (c % 2 == 0) {
        event.kind = TierEvent::Kind::kStored;
        event.tokens = pieces;
      } else {
        event.kind = TierEvent::Kind::kRemoved;
      }
      (*publisher)->OnTierEvent(event);
    }
    call_ns += std::chrono::duration<double, std::nano>(
                   std::chrono::steady_clock::now() - start)
                   .count();
    (*publisher)->Flush();
  }
  const KvEventPublisherStats stats = (*publisher)->stats();
  stop.store(true);
  reader.join();
  state.counters["events_per_s"] = benchmark::Counter(
      static_cast<double>(stats.events_published), benchmark::Counter::kIsRate);
  state.counters["blocks_per_s"] = benchmark::Counter(
      static_cast<double>(stats.blocks_published), benchmark::Counter::kIsRate);
  state.counters["call_ns"] =
      call_ns / static_cast<double>(state.iterations() * kCalls);
  state.counters["dropped"] = static_cast<double>(stats.events_dropped);
  state.counters["batches_received"] = static_cast<double>(received.load());
  publisher->reset();
  rmdir(dir);
}
BENCHMARK(BM_Publish)->Arg(1)->Arg(4)->Arg(32)->UseRealTime();

}  // namespace
}  // namespace hicache::events

BENCHMARK_MAIN();
