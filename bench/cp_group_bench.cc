// The commit latency a remote CP group follower adds (issue 13's goal:
// last local ack -> committed, p50 <= 300 us over loopback), side by side
// with a single daemon in one run. bench/cp_group_rig.h states the two rigs
// and what is timed.
//
//   bazel run --config=opt //bench:cp_group_bench -- --iterations=2000
//       [--mode=both|in_process|processes] [--daemon=PATH]
//       [--pages=8 --page_size=16 --kv_preset=tiny]
//       [--drain_before_last_step=true] [--json]
//
// --mode=in_process (bench/cp_group_rig.h) measures the exact definition
// inside one process; --mode=processes (bench/cp_group_processes.h) starts
// real hicached processes (a standalone C = 2 daemon, and a leader +
// follower group) and drives them over gRPC as a scheduler does; "both"
// (default) runs one then the other.
//
// Iterations interleave the two rigs (baseline then group, then group then
// baseline, ...) after --warmup untimed ones each, so both see the same
// machine noise. Then the tree calls (Match of an absent key, Allocate +
// Free) are timed on both engines, interleaved the same way.
//
// Reported per rig: p50 / p99 (nearest rank, bench/percentile.h) of
//   local ack -> committed   rank 0's final StepDone reaching the engine
//   step event -> committed  kBackupStep(rank 0, last step)
//   prepare -> committed     the whole backup
// and "added": group p50 minus baseline p50, with the ratio of the p50s,
// then the commit interval's tail (p90, p99.9, max, how many over 1 ms).
// The process mode reports layer_stored(last) -> committed and
// prepare -> committed as the scheduler sees them over gRPC, and the
// MatchPrefix / Allocate RPC latency of the standalone daemon and the
// leader. Both modes exit non-zero on any error; the process mode also
// when the group is not "formed" with no deaths at the end.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cp_group_processes.h"
#include "bench/cp_group_rig.h"
#include "bench/percentile.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, iterations, 2000, "Timed backups per rig.");
ABSL_FLAG(int, warmup, 50, "Untimed backups per rig first.");
ABSL_FLAG(int, tree_calls, 2000, "Timed Match and Allocate calls per rig.");
ABSL_FLAG(int, pages, 8, "Pages per backup, zigzag over ranks 0 and 1.");
ABSL_FLAG(uint32_t, page_size, 16, "Tokens per page.");
ABSL_FLAG(std::string, kv_preset, "tiny", "KV preset.");
ABSL_FLAG(int, transfer_workers, 2, "memcpy threads per copy engine.");
ABSL_FLAG(int, heartbeat_ms, 100, "in_process: group heartbeat interval.");
ABSL_FLAG(int, heartbeat_timeout_ms, 1000,
          "in_process: group heartbeat timeout.");
ABSL_FLAG(bool, drain_before_last_step, true,
          "Wait for the earlier steps' copies before storing the last "
          "(layers spaced out by compute, as in a forward pass).");
ABSL_FLAG(bool, json, false, "Also print one JSON line of the figures.");
ABSL_FLAG(std::string, mode, "both", "in_process, processes or both.");
ABSL_FLAG(std::string, daemon, "",
          "processes: the hicached binary; empty: //daemon:hicached's "
          "runfile.");
ABSL_FLAG(int, heartbeat_ms_processes, 0,
          "processes: --cp_group_heartbeat_ms (0: hicached's default).");
ABSL_FLAG(int, timeout_ms_processes, 0,
          "processes: --cp_group_timeout_ms (0: hicached's default).");

namespace hicache::bench {
namespace {

struct Samples {
  std::vector<double> ack, step, end_to_end, match, allocate;
};

struct Summary {
  double p50 = 0, p99 = 0;
};
Summary Sum(const std::vector<double>& v) {
  return {Percentile(v, 0.5), Percentile(v, 0.99)};
}

void Row(const char* what, const std::vector<double>& base,
         const std::vector<double>& group) {
  const Summary b = Sum(base), g = Sum(group);
  std::printf("%-28s %10.1f %10.1f %10.1f %10.1f %+10.1f %7.2fx\n", what,
              b.p50, b.p99, g.p50, g.p99, g.p50 - b.p50,
              b.p50 > 0 ? g.p50 / b.p50 : 0.0);
}

// The tail of a commit interval: where a p99 comes from.
void TailRow(const char* what, const std::vector<double>& base,
             const std::vector<double>& group) {
  auto over = [](const std::vector<double>& v, double us) {
    return std::count_if(v.begin(), v.end(), [us](double x) { return x > us; });
  };
  std::printf(
      "  tail of %s: p90 %.1f / %.1f, p99.9 %.1f / %.1f, max %.1f / %.1f, "
      "over 1 ms %ld / %ld of %zu / %zu\n",
      what, Percentile(base, 0.9), Percentile(group, 0.9),
      Percentile(base, 0.999), Percentile(group, 0.999), Percentile(base, 1),
      Percentile(group, 1), static_cast<long>(over(base, 1000)),
      static_cast<long>(over(group, 1000)), base.size(), group.size());
}

std::string JsonPair(const char* key, const std::vector<double>& v) {
  const Summary s = Sum(v);
  return absl::StrFormat("\"%s_p50_us\":%.1f,\"%s_p99_us\":%.1f", key, s.p50,
                         key, s.p99);
}

int InProcess() {
  CommitRigOptions options;
  options.page_size = absl::GetFlag(FLAGS_page_size);
  options.kv_preset = absl::GetFlag(FLAGS_kv_preset);
  options.pages_per_backup = absl::GetFlag(FLAGS_pages);
  options.device_pages_per_rank =
      std::max<int64_t>(256, 4 * options.pages_per_backup);
  options.host_pages_per_rank = options.device_pages_per_rank * 2;
  options.transfer_workers = absl::GetFlag(FLAGS_transfer_workers);
  options.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_ms));
  options.heartbeat_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  options.drain_before_last_step = absl::GetFlag(FLAGS_drain_before_last_step);

  auto baseline = CommitRig::Baseline(options);
  if (!baseline.ok()) {
    std::fprintf(stderr, "baseline rig: %s\n",
                 baseline.status().ToString().c_str());
    return 1;
  }
  auto group = CommitRig::Group(options);
  if (!group.ok()) {
    std::fprintf(stderr, "group rig: %s\n", group.status().ToString().c_str());
    return 1;
  }
  CommitRig* rigs[2] = {baseline->get(), group->get()};
  Samples samples[2];
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int iterations = absl::GetFlag(FLAGS_iterations);
  int64_t key = 0;
  for (int i = 0; i < warmup + iterations; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int r = (i % 2 == 0) ? k : 1 - k;  // Alternate who goes first.
      auto timing = rigs[r]->Backup(++key);
      if (!timing.ok()) {
        std::fprintf(stderr, "%s backup %d: %s\n", rigs[r]->name().c_str(), i,
                     timing.status().ToString().c_str());
        return 1;
      }
      if (i < warmup) continue;
      samples[r].ack.push_back(timing->ack_to_commit_us);
      samples[r].step.push_back(timing->step_to_commit_us);
      samples[r].end_to_end.push_back(timing->end_to_end_us);
    }
  }
  const int tree_calls = absl::GetFlag(FLAGS_tree_calls);
  for (int i = 0; i < tree_calls; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int r = (i % 2 == 0) ? k : 1 - k;
      auto match = rigs[r]->TimeMatch(++key);
      auto allocate = rigs[r]->TimeAllocate();
      if (!match.ok() || !allocate.ok()) {
        std::fprintf(stderr, "%s tree calls: %s\n", rigs[r]->name().c_str(),
                     (match.ok() ? allocate.status() : match.status())
                         .ToString()
                         .c_str());
        return 1;
      }
      samples[r].match.push_back(*match);
      samples[r].allocate.push_back(*allocate);
    }
  }

  std::printf(
      "CP group commit latency, in process: C = 2, baseline = one engine "
      "with both ranks local; group = leader (rank 0) + follower (rank 1) "
      "over Gloo TCP 127.0.0.1\n"
      "%d interleaved backups per rig (after %d warm-up), %d pages zigzag, "
      "page_size %u, %s (%u steps), heartbeat %d ms, drain before last step: "
      "%s; %d tree calls each\n\n",
      iterations, warmup, options.pages_per_backup, options.page_size,
      options.kv_preset.c_str(), rigs[0]->num_steps(),
      absl::GetFlag(FLAGS_heartbeat_ms),
      options.drain_before_last_step ? "yes" : "no", tree_calls);
  std::printf("%-28s %10s %10s %10s %10s %10s %8s\n", "microseconds",
              "base p50", "base p99", "group p50", "group p99", "added p50",
              "ratio");
  Row("local ack -> committed", samples[0].ack, samples[1].ack);
  Row("step event -> committed", samples[0].step, samples[1].step);
  TailRow("local ack -> committed (base / group)", samples[0].ack,
          samples[1].ack);
  Row("prepare -> committed", samples[0].end_to_end, samples[1].end_to_end);
  Row("Match (absent key)", samples[0].match, samples[1].match);
  Row("Allocate", samples[0].allocate, samples[1].allocate);
  if (absl::GetFlag(FLAGS_json)) {
    std::string line =
        absl::StrCat("{\"in_process\":true,\"iterations\":", iterations);
    const char* names[2] = {"baseline", "group"};
    for (int r = 0; r < 2; ++r) {
      absl::StrAppend(&line, ",\"", names[r], "\":{",
                      JsonPair("ack_to_commit", samples[r].ack), ",",
                      JsonPair("step_to_commit", samples[r].step), ",",
                      JsonPair("prepare_to_commit", samples[r].end_to_end),
                      ",", JsonPair("match", samples[r].match), ",",
                      JsonPair("allocate", samples[r].allocate), "}");
    }
    absl::StrAppend(
        &line,
        absl::StrFormat(",\"added_ack_to_commit_p50_us\":%.1f}",
                        Sum(samples[1].ack).p50 - Sum(samples[0].ack).p50));
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

int Processes(const char* argv0) {
  ProcessBenchOptions o;
  o.daemon = absl::GetFlag(FLAGS_daemon);
  o.argv0 = argv0;
  o.iterations = absl::GetFlag(FLAGS_iterations);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.tree_calls = absl::GetFlag(FLAGS_tree_calls);
  o.pages = absl::GetFlag(FLAGS_pages);
  o.page_size = absl::GetFlag(FLAGS_page_size);
  o.kv_preset = absl::GetFlag(FLAGS_kv_preset);
  o.heartbeat_ms = absl::GetFlag(FLAGS_heartbeat_ms_processes);
  o.timeout_ms = absl::GetFlag(FLAGS_timeout_ms_processes);
  auto r = RunProcessBench(o);
  if (!r.ok()) {
    std::fprintf(stderr, "processes: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "\nCP group commit latency, processes: single = one hicached serving "
      "C = 2; group = hicached leader (--ranks=0) + follower (--ranks=1) over "
      "Gloo TCP 127.0.0.1; the bench is the scheduler over gRPC (unix "
      "sockets)\n"
      "%d interleaved backups per daemon (after %d warm-up), %d pages "
      "zigzag, page_size %u, %s (%u steps), heartbeat %s; %d tree calls "
      "each; group state at the end: %s, deaths %lld\n\n",
      o.iterations, o.warmup, o.pages, o.page_size, o.kv_preset.c_str(),
      r->num_steps,
      o.heartbeat_ms > 0 ? absl::StrCat(o.heartbeat_ms, " ms").c_str()
                         : "default",
      o.tree_calls, r->group_state.c_str(),
      static_cast<long long>(r->group_deaths));
  std::printf("%-28s %10s %10s %10s %10s %10s %8s\n", "microseconds",
              "single p50", "single p99", "group p50", "group p99",
              "added p50", "ratio");
  Row("layer_stored(last) -> commit", r->final_step_to_commit[0],
      r->final_step_to_commit[1]);
  TailRow("layer_stored(last) -> commit (single / group)",
          r->final_step_to_commit[0], r->final_step_to_commit[1]);
  Row("prepare -> committed", r->prepare_to_commit[0],
      r->prepare_to_commit[1]);
  Row("MatchPrefix (absent key)", r->match[0], r->match[1]);
  Row("Allocate", r->allocate[0], r->allocate[1]);
  if (absl::GetFlag(FLAGS_json)) {
    std::string line = absl::StrCat("{\"processes\":true,\"iterations\":",
                                    o.iterations);
    const char* names[2] = {"single", "group"};
    for (int k = 0; k < 2; ++k) {
      absl::StrAppend(
          &line, ",\"", names[k], "\":{",
          JsonPair("final_step_to_commit", r->final_step_to_commit[k]), ",",
          JsonPair("prepare_to_commit", r->prepare_to_commit[k]), ",",
          JsonPair("match", r->match[k]), ",",
          JsonPair("allocate", r->allocate[k]), "}");
    }
    absl::StrAppend(&line, "}");
    std::printf("%s\n", line.c_str());
  }
  return r->group_state == "formed" && r->group_deaths == 0 ? 0 : 1;
}

int Main(const char* argv0) {
  spdlog::set_level(spdlog::level::warn);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "in_process" && mode != "processes" && mode != "both") {
    std::fprintf(stderr, "--mode must be in_process, processes or both\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_iterations) < 1 || absl::GetFlag(FLAGS_warmup) < 0 ||
      absl::GetFlag(FLAGS_tree_calls) < 1) {
    std::fprintf(stderr, "--iterations and --tree_calls must be >= 1\n");
    return 2;
  }
  int rc = 0;
  if (mode != "processes") rc = InProcess();
  if (rc == 0 && mode != "in_process") {
    std::fflush(stdout);
    rc = Processes(argv0);
  }
  return rc;
}

}  // namespace
}  // namespace hicache::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::bench::Main(argv[0]);
}
