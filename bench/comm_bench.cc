// Round trip of one frame over a CP-group link (daemon/comm): the leader
// end sends a frame, the follower end's receiver sends it straight back, the
// leader's receiver wakes the benchmark thread. Reports median_us / p99_us
// of the whole round trip (Send() to the reply's delivery), per frame size.
// Gloo runs over TCP on 127.0.0.1 (two devices, as two daemons would have);
// the in-process loopback link is the floor (thread hand-offs only).
//
//   bazel run --config=opt //bench:comm_bench -- --benchmark_repetitions=3

#include <stdlib.h>

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>

#include "bench/latencies.h"
#include "benchmark/benchmark.h"
#include "daemon/comm/gloo_communicator.h"
#include "daemon/comm/loopback_communicator.h"
#include "gloo/rendezvous/file_store.h"

namespace hicache::comm {
namespace {

// Counts replies delivered to the leader end.
class Replies {
 public:
  void Arrived() {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    cv_.notify_one();
  }
  // Waits until `n` replies arrived in all.
  void WaitFor(uint64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return count_ >= n || failed_; });
  }
  void Failed() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_one();
  }
  bool failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t count_ = 0;
  bool failed_ = false;
};

// Runs the ping-pong over a connected pair, then closes it (the callbacks
// use locals of this function).
void PingPong(benchmark::State& state, std::unique_ptr<Communicator> leader_end,
              std::unique_ptr<Communicator> follower_end) {
  Replies replies;
  Communicator& leader = *leader_end;
  Communicator& follower = *follower_end;
  struct Closer {
    std::unique_ptr<Communicator>& a;
    std::unique_ptr<Communicator>& b;
    ~Closer() {
      a.reset();
      b.reset();
    }
  } closer{leader_end, follower_end};
  if (!follower
           .Start([&](absl::string_view frame) {
                    (void)follower.Send(std::string(frame));
                  },
                  [](const absl::Status&) {})
           .ok() ||
      !leader
           .Start([&](absl::string_view) { replies.Arrived(); },
                  [&](const absl::Status&) { replies.Failed(); })
           .ok()) {
    state.SkipWithError("Start failed");
    return;
  }
  const std::string frame(static_cast<size_t>(state.range(0)), 'p');
  uint64_t sent = 0;
  // Warm up (connection, buffers, thread wake-ups).
  for (int i = 0; i < 100; ++i) {
    (void)leader.Send(frame);
    replies.WaitFor(++sent);
  }
  Latencies round_trip;
  for (auto _ : state) {
    round_trip.Time([&] {
      (void)leader.Send(frame);
      replies.WaitFor(++sent);
      return 0;
    });
    if (replies.failed()) {
      state.SkipWithError("link failed");
      break;
    }
  }
  round_trip.Report(state);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          state.range(0) * 2);
}

void BM_GlooRoundTrip(benchmark::State& state) {
  char pattern[] = "/tmp/hicache-comm-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string dir = pattern;
  {
    gloo::rendezvous::FileStore stores[2] = {
        gloo::rendezvous::FileStore(dir), gloo::rendezvous::FileStore(dir)};
    GlooLinkOptions options[2];
    for (int rank = 0; rank < 2; ++rank) {
      auto device = GlooCommunicator::CreateTcpDevice("127.0.0.1");
      if (!device.ok()) {
        state.SkipWithError("no Gloo device");
        return;
      }
      options[rank].store = &stores[rank];
      options[rank].key_prefix = "bench";
      options[rank].rank = rank;
      options[rank].device = *device;
      options[rank].receive_timeout = absl::Seconds(30);
    }
    auto follower = std::async(std::launch::async, [&] {
      return GlooCommunicator::Connect(options[1]);
    });
    auto leader = GlooCommunicator::Connect(options[0]);
    auto follower_link = follower.get();
    if (!leader.ok() || !follower_link.ok()) {
      state.SkipWithError("Gloo connect failed");
    } else {
      PingPong(state, *std::move(leader), *std::move(follower_link));
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}
BENCHMARK(BM_GlooRoundTrip)
    ->Arg(64)
    ->Arg(4096)
    ->Arg(64 << 10)
    ->Arg(1 << 20)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_LoopbackRoundTrip(benchmark::State& state) {
  auto [leader, follower] = LoopbackCommunicator::CreatePair();
  PingPong(state, std::move(leader), std::move(follower));
}
BENCHMARK(BM_LoopbackRoundTrip)
    ->Arg(64)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace hicache::comm
