#pragma once

// Per-call latency samples for Google Benchmark runs, reported as counters
// `<prefix>median_us` and `<prefix>p99_us` (Google Benchmark's own figures
// are means over iterations).

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "bench/percentile.h"
#include "benchmark/benchmark.h"

namespace hicache {

class Latencies {
 public:
  // Runs fn(), records its wall time, returns its result.
  template <typename Fn>
  auto Time(Fn fn) {
    const auto start = std::chrono::steady_clock::now();
    auto result = fn();
    samples_.push_back(std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - start)
                           .count());
    return result;
  }

  void Report(benchmark::State& state, const std::string& prefix = "") {
    if (samples_.empty()) return;
    state.counters[prefix + "median_us"] = Percentile(samples_, 0.5);
    state.counters[prefix + "p99_us"] = Percentile(samples_, 0.99);
  }

 private:
  std::vector<double> samples_;
};

}  // namespace hicache
