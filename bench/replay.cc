// In-process replay of a Mooncake-format trace through the HiCache engine
// (bench/replay_lib.h), for every combination of the given write and
// eviction policies, with the trace's bounds for reference: the offline
// Belady-with-bypass bound for L1+L2 (and for L1 alone) and single-tier LRU
// (bench/cache_bound.h). Capacities are in blocks of --block_tokens tokens.
//
//   bazel run --config=opt //bench:replay -- --l1_blocks=6000 --l2_blocks=12000
//   bazel run --config=opt //bench:replay -- \
//       --trace=$PWD/bench/traces/conversations.jsonl
//   With --state_dir=DIR the host tier is journaled as hicached
//   --state_dir does (docs/hot-restart.md); each replay starts cold.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/cache_bound.h"
#include "bench/kv_event_sink.h"
#include "bench/mooncake_trace.h"
#include "bench/percentile.h"
#include "bench/replay_lib.h"
#include "daemon/core/policies.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, trace, "",
          "Mooncake trace (default: bench/traces/mooncake_synthetic.jsonl).");
ABSL_FLAG(int64_t, requests, -1, "Replay at most this many requests.");
ABSL_FLAG(int64_t, block_tokens, 512, "Tokens per hash id.");
ABSL_FLAG(int64_t, l1_blocks, 6000, "Device (L1) capacity in blocks.");
ABSL_FLAG(int64_t, l2_blocks, 12000, "Host (L2) capacity in blocks.");
ABSL_FLAG(std::string, policies, "lru,lfu,fifo,slru,tinylfu",
          "Eviction policies to run.");
ABSL_FLAG(std::string, write_policies, "write_ahead",
          "Write policies to run: write_ahead (the daemon's default), "
          "write_through, write_through_selective, write_back.");
ABSL_FLAG(bool, deterministic, true,
          "Every backup settles before the next request (reproducible "
          "figures); false lets copies overlap later requests.");
ABSL_FLAG(int64_t, slow_backups_for, 0,
          "Hold backup completions back for this many requests (0: off).");
ABSL_FLAG(std::string, kv_preset, "micro",
          "KV geometry of the pools: micro (256 B a page at P = 64), tiny "
          "(2 KiB), ... (hicached --kv_preset).");
ABSL_FLAG(bool, kv_events, false,
          "Run every pair twice, side by side: without KV events and with "
          "them published (blocks of --kv_events_block_size tokens, to a "
          "subscriber in another process; docs/kv-events.md), and print the "
          "overhead.");
ABSL_FLAG(uint32_t, kv_events_block_size, 16, "--kv_events: tokens a block.");
ABSL_FLAG(int, kv_events_runs, 5,
          "--kv_events: pairs of runs (without, with), alternating; the "
          "median of the pairs' ratios is reported.");
ABSL_FLAG(std::string, kv_event_sink, "",
          "Internal (--kv_events): be the subscriber process for this "
          "endpoint.");
ABSL_FLAG(int64_t, l3_blocks, 0,
          "Storage tier (L3) capacity in blocks: a file store in --l3_dir "
          "(0: no storage tier).");
ABSL_FLAG(std::string, l3_dir, "",
          "Directory of the storage tier's files (empty: a temporary one).");
ABSL_FLAG(std::string, state_dir, "",
          "Journal the host tier into this directory (hot restart); empty: "
          "no journal.");

namespace hicache {
namespace {

// This process's bytes written to storage so far (/proc/self/io
// write_bytes), or -1 when the kernel does not say.
long long WrittenBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  long long value = 0;
  while (io >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return -1;
}

// CPU seconds (user + system) this process has used, all threads.
double CpuSeconds() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

// CPU seconds (user + system) of this process's children that have been
// waited for.
double ChildCpuSeconds() {
  rusage usage{};
  if (getrusage(RUSAGE_CHILDREN, &usage) != 0) return 0;
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return secs(usage.ru_utime) + secs(usage.ru_stime);
}

// Without and with KV events, alternating, in this process, with a
// subscriber in a process of its own (bench/kv_event_sink.h): the median
// of each pair's ratio of requests per second, the medians of CPU per
// request, and what was published and received.
bool CompareKvEvents(const std::vector<TraceRequest>& trace,
                     ReplayConfig config) {
  char dir[] = "/tmp/hicache-replay-events-XXXXXX";
  if (mkdtemp(dir) == nullptr) return false;
  const std::string endpoint = absl::StrCat("ipc://", dir, "/events");
  std::vector<double> ratios, off_rps, on_rps, off_cpu, on_cpu, sink_cpu;
  std::vector<double> off_caller, on_caller;  // Of the requests' thread.
  ReplayOutcome last;
  bench::KvEventSinkCounts received;
  bool ok = true;
  for (int run = 0; ok && run < absl::GetFlag(FLAGS_kv_events_runs); ++run) {
    // Alternating which goes first (ABBA), so that whatever one run
    // leaves behind for the next weighs on both sides alike.
    double rps_of[2] = {0, 0};
    for (bool events : {run % 2 == 1, run % 2 == 0}) {
      std::unique_ptr<bench::KvEventSink> sink;
      if (events) {
        auto started = bench::KvEventSink::Start("/proc/self/exe", endpoint);
        if (!started.ok()) {
          std::fprintf(stderr, "%s\n", started.status().ToString().c_str());
          ok = false;
          break;
        }
        sink = *std::move(started);
      }
      config.kv_events_endpoint = events ? endpoint : "";
      config.kv_events_block_size = absl::GetFlag(FLAGS_kv_events_block_size);
      const double cpu_before = CpuSeconds();
      auto out = ReplayTrace(trace, config);
      const double cpu = CpuSeconds() - cpu_before;
      if (!out.ok()) {
        std::fprintf(stderr, "replay failed: %s\n",
                     out.status().ToString().c_str());
        ok = false;
        break;
      }
      const double rps = out->requests / out->seconds;
      const double cpu_us = 1e6 * cpu / out->requests;
      (events ? on_caller : off_caller)
          .push_back(1e6 * out->caller_cpu_seconds / out->requests);
      rps_of[events] = rps;
      if (!events) {
        off_rps.push_back(rps);
        off_cpu.push_back(cpu_us);
        continue;
      }
      const double children_before = ChildCpuSeconds();
      auto counts = sink->Stop();
      if (!counts.ok()) {
        std::fprintf(stderr, "%s\n", counts.status().ToString().c_str());
        ok = false;
        break;
      }
      sink_cpu.push_back(1e6 * (ChildCpuSeconds() - children_before) /
                         out->requests);
      received = *counts;
      on_rps.push_back(rps);
      on_cpu.push_back(cpu_us);
      last = *out;
    }
    if (ok) {
      ratios.push_back(rps_of[1] / rps_of[0]);
      if (getenv("HICACHE_REPLAY_VERBOSE") != nullptr) {
        std::fprintf(stderr, "pair %d: %.0f without, %.0f with\n", run,
                     rps_of[0], rps_of[1]);
      }
    }
  }
  // The ipc endpoint's socket file first: rmdir takes only an empty
  // directory (each run left one behind before).
  unlink(absl::StrCat(dir, "/events").c_str());
  rmdir(dir);
  if (!ok) return false;
  std::printf(
      "  kv events (blocks of %u): %.0f req/s without, %.0f with (medians "
      "of %zu); paired: %.1f%% fewer req/s with (median of the pairs' "
      "ratios)\n"
      "  CPU per request: the requests' thread %.1f us without, %.1f with "
      "(%+.1f%%); the process %.0f us without, %.0f with; %.0f us in the "
      "subscriber process\n"
      "  published %lld events (%lld blocks) in %lld batches, %lld dropped; "
      "the subscriber received %lld batches (%.1f MB); the last sent %.0f ms "
      "after the last request\n",
      config.kv_events_block_size, Percentile(off_rps, 0.5),
      Percentile(on_rps, 0.5), off_rps.size(),
      100 * (1 - Percentile(ratios, 0.5)), Percentile(off_caller, 0.5),
      Percentile(on_caller, 0.5),
      100 * (Percentile(on_caller, 0.5) / Percentile(off_caller, 0.5) - 1),
      Percentile(off_cpu, 0.5),
      Percentile(on_cpu, 0.5), Percentile(sink_cpu, 0.5),
      static_cast<long long>(last.kv_events),
      static_cast<long long>(last.kv_event_blocks),
      static_cast<long long>(last.kv_event_batches),
      static_cast<long long>(last.kv_events_dropped),
      static_cast<long long>(received.batches), received.bytes / 1e6,
      1e3 * last.kv_events_lag_seconds);
  return true;
}

int Main() {
  spdlog::set_level(spdlog::level::err);
  const std::string path = TracePathOrDefault(absl::GetFlag(FLAGS_trace));
  auto trace = ReadMooncakeTrace(path, absl::GetFlag(FLAGS_requests));
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  ReplayConfig config;
  config.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  config.l1_blocks = absl::GetFlag(FLAGS_l1_blocks);
  config.l2_blocks = absl::GetFlag(FLAGS_l2_blocks);
  config.deterministic = absl::GetFlag(FLAGS_deterministic);
  config.slow_backups_for = absl::GetFlag(FLAGS_slow_backups_for);
  config.state_dir = absl::GetFlag(FLAGS_state_dir);
  config.kv_preset = absl::GetFlag(FLAGS_kv_preset);
  config.l3_blocks = absl::GetFlag(FLAGS_l3_blocks);
  config.l3_dir = absl::GetFlag(FLAGS_l3_dir);
  const BlockTrace blocks = BlockTrace::Build(*trace);
  const CacheBoundResult bound12 =
      BeladyBound(blocks, config.l1_blocks + config.l2_blocks);
  const CacheBoundResult bound1 = BeladyBound(blocks, config.l1_blocks);
  std::printf(
      "trace %s: %zu requests, %lld blocks; L1 %lld blocks, L2 %lld blocks\n",
      path.c_str(), trace->size(),
      static_cast<long long>(blocks.total_blocks()),
      static_cast<long long>(config.l1_blocks),
      static_cast<long long>(config.l2_blocks));
  std::printf(
      "bounds: infinite %.2f%%; Belady-with-bypass L1 %.2f%%, L1+L2 %.2f%%; "
      "LRU L1 %.2f%%, LRU L1+L2 (one exclusive tier) %.2f%%\n",
      100 * InfiniteRate(blocks).rate(), 100 * bound1.rate(),
      100 * bound12.rate(), 100 * LruRate(blocks, config.l1_blocks).rate(),
      100 * LruRate(blocks, config.l1_blocks + config.l2_blocks).rate());
  // p50/p99: one request's engine calls; admit: its allocation and backup
  // preparation (what Admit does after the match).
  std::printf(
      "%-23s %-8s %7s %9s %8s %7s %7s %9s %9s %8s %8s %9s %9s %6s\n", "write",
      "evict", "L1 hit", "L1+L2 hit", "% bound", "backups", "loads",
      "rejected", "dropped", "p50 us", "p99 us", "admit p50", "admit p99",
      "secs");
  for (absl::string_view write_name :
       absl::StrSplit(absl::GetFlag(FLAGS_write_policies), ',')) {
    auto write = ParsePolicy<WritePolicy>(write_name);
    if (!write.ok()) {
      std::fprintf(stderr, "%s\n", std::string(write.status().message()).c_str());
      return 2;
    }
    for (absl::string_view name :
         absl::StrSplit(absl::GetFlag(FLAGS_policies), ',')) {
      auto policy = ParsePolicy<EvictionPolicy>(name);
      if (!policy.ok()) {
        std::fprintf(stderr, "%s\n",
                     std::string(policy.status().message()).c_str());
        return 2;
      }
      config.write_policy = *write;
      config.eviction_policy = *policy;
      const long long written_before = WrittenBytes();
      const double cpu_before = CpuSeconds();
      auto out = ReplayTrace(*trace, config);
      const double cpu = CpuSeconds() - cpu_before;
      const long long written = WrittenBytes() - written_before;
      if (!out.ok()) {
        std::fprintf(stderr, "replay failed: %s\n",
                     out.status().ToString().c_str());
        return 1;
      }
      std::printf(
          "%-23s %-8s %6.2f%% %8.2f%% %7.1f%% %7lld %7lld %9lld %9lld %8.0f "
          "%8.0f %9.0f %9.0f %6.1f\n",
          std::string(write_name).c_str(), std::string(name).c_str(),
          100 * out->l1_rate(), 100 * out->l12_rate(),
          100 * out->l12_rate() / bound12.rate(),
          static_cast<long long>(out->stats.backups_committed),
          static_cast<long long>(out->stats.loads_done),
          static_cast<long long>(out->stats.write_back_rejected),
          static_cast<long long>(out->stats.host_copies_dropped),
          out->request_p50_us, out->request_p99_us, out->admit_p50_us,
          out->admit_p99_us, out->seconds);
      if (config.l3_blocks > 0) {
        std::printf(
            "  L3 (%lld blocks): L1+L2+L3 hit %.2f%% (%.1f%% of infinite); "
            "%lld pages promoted, %lld stored (%lld evicted), %lld "
            "checksum failures; promotions skipped %lld, failed %lld\n",
            static_cast<long long>(config.l3_blocks), 100 * out->l123_rate(),
            100 * out->l123_rate() / InfiniteRate(blocks).rate(),
            static_cast<long long>(out->stats.storage_promoted_pages),
            static_cast<long long>(out->store.puts),
            static_cast<long long>(out->store.evictions),
            static_cast<long long>(out->store.checksum_failures),
            static_cast<long long>(out->stats.storage_promotions_skipped),
            static_cast<long long>(out->stats.storage_promotions_failed));
      }
      std::printf(
          "  device victims: %lld to the host tier, %lld removed; pages "
          "evicted: %lld device, %lld host\n",
          static_cast<long long>(out->stats.device_victims_to_host),
          static_cast<long long>(out->stats.device_victims_removed),
          static_cast<long long>(out->stats.device_evicted_pages),
          static_cast<long long>(out->stats.host_evicted_pages));
      if (out->persistence.enabled) {
        std::printf(
            "  journal: %lld puts, %lld live, file %llu bytes, status %s, "
            "final flush %.1f ms; %.0f req/s, %.2f CPU s; process wrote %lld "
            "bytes to storage\n",
            static_cast<long long>(out->persistence.journal_puts),
            static_cast<long long>(out->persistence.journal_live),
            static_cast<unsigned long long>(
                out->persistence.journal_file_bytes),
            out->persistence.journal_status.c_str(),
            out->flush_seconds * 1e3, out->requests / out->seconds, cpu,
            written);
        const HostTierPersistence& p = out->persistence;
        std::printf(
            "  journal lag: recorder (report to journal, settle included) "
            "p50 %.1f ms, p99 %.1f ms, max %.1f ms; writer (record to sync) "
            "p50 %.1f ms, p99 %.1f ms, max %.1f ms; refused %lld, stopped "
            "%s\n",
            absl::ToDoubleMilliseconds(p.recorder_lag_p50),
            absl::ToDoubleMilliseconds(p.recorder_lag_p99),
            absl::ToDoubleMilliseconds(p.recorder_lag_max),
            absl::ToDoubleMilliseconds(p.writer_lag_p50),
            absl::ToDoubleMilliseconds(p.writer_lag_p99),
            absl::ToDoubleMilliseconds(p.writer_lag_max),
            static_cast<long long>(p.journal_puts_refused),
            p.journal_stopped ? "yes" : "no");
      } else {
        std::printf("  %.0f req/s, %.2f CPU s\n", out->requests / out->seconds,
                    cpu);
      }
      if (absl::GetFlag(FLAGS_kv_events)) {
        if (!CompareKvEvents(*trace, config)) return 1;
      }
      if (out->deferred_inserts > 0 || out->failed_allocations > 0 ||
          out->leaked_pages > 0) {
        std::printf("  deferred inserts %lld (retried %lld, gave up %lld), "
                    "failed allocations %lld, leaked pages %lld\n",
                    static_cast<long long>(out->deferred_inserts),
                    static_cast<long long>(out->deferred_retried),
                    static_cast<long long>(out->deferred_gave_up),
                    static_cast<long long>(out->failed_allocations),
                    static_cast<long long>(out->leaked_pages));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const std::string sink = absl::GetFlag(FLAGS_kv_event_sink);
      !sink.empty()) {
    return hicache::bench::RunKvEventSink(sink);
  }
  return hicache::Main();
}
