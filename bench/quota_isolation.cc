// Tenant isolation by namespace quotas (docs/quotas.md), side by side in one
// run: tenant "b" replays a Mooncake trace while tenant "a" floods the cache
// with sequences never seen again (a scan: one request of `flood_blocks`
// fresh blocks after each of b's). For b it reports the L1+L2 hit rate
//   alone          -- b by itself (the reference),
//   flood          -- with the flood and no quota,
//   guaranteed     -- with the flood, b guaranteed --share of each tier,
//   limited        -- with the flood, a limited to the rest of each tier,
//   both           -- with the flood, both quotas,
// and, with a guarantee, whether any of a's requests pushed b below it.
// The engine runs in-process at the daemon's policies (hit rates do not
// depend on the process split); deterministic, so two runs agree.
//
//   bazel run -c opt //bench:quota_isolation -- \
//     --trace=$PWD/bench/traces/mooncake_synthetic.jsonl
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "bench/mooncake_trace.h"
#include "bench/replay_lib.h"
#include "daemon/core/policies.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, trace, "", "Mooncake-format trace (tenant b).");
ABSL_FLAG(int64_t, requests, -1, "Replay at most this many of b's requests.");
ABSL_FLAG(int64_t, l1_blocks, 6000, "Device (L1) capacity in blocks.");
ABSL_FLAG(int64_t, l2_blocks, 12000, "Host (L2) capacity in blocks.");
ABSL_FLAG(int64_t, flood_blocks, 40,
          "Blocks of each flood request (fresh, never repeated).");
ABSL_FLAG(std::string, write_policy, "",
          "Write policy (default: the daemon's).");
ABSL_FLAG(double, host_share, -1,
          "b's guaranteed share of the host tier (-1: --share).");
ABSL_FLAG(double, share, 0.75,
          "b's guaranteed share of each tier (guaranteed); a's limit is the "
          "rest (limited).");

namespace hicache {
namespace {

int Main() {
  spdlog::set_level(spdlog::level::err);
  const std::string path = TracePathOrDefault(absl::GetFlag(FLAGS_trace));
  absl::StatusOr<std::vector<TraceRequest>> b =
      ReadMooncakeTrace(path, absl::GetFlag(FLAGS_requests));
  if (!b.ok()) {
    std::fprintf(stderr, "quota_isolation: %s\n", b.status().ToString().c_str());
    return 1;
  }
  int64_t next_id = 0;
  for (TraceRequest& r : *b) {
    r.ns = "b";
    for (int64_t h : r.hash_ids) next_id = std::max(next_id, h + 1);
  }
  // b's requests with a flood request of "a" after each.
  std::vector<TraceRequest> flooded;
  flooded.reserve(2 * b->size());
  for (const TraceRequest& r : *b) {
    flooded.push_back(r);
    TraceRequest scan;
    scan.ns = "a";
    for (int64_t i = 0; i < absl::GetFlag(FLAGS_flood_blocks); ++i) {
      scan.hash_ids.push_back(next_id++);
    }
    flooded.push_back(std::move(scan));
  }
  ReplayConfig config;
  config.l1_blocks = absl::GetFlag(FLAGS_l1_blocks);
  config.l2_blocks = absl::GetFlag(FLAGS_l2_blocks);
  if (!absl::GetFlag(FLAGS_write_policy).empty()) {
    absl::StatusOr<WritePolicy> policy =
        ParsePolicy<WritePolicy>(absl::GetFlag(FLAGS_write_policy));
    if (!policy.ok()) {
      std::fprintf(stderr, "quota_isolation: %s\n",
                   policy.status().ToString().c_str());
      return 2;
    }
    config.write_policy = *policy;
  }
  const int64_t pages_per_block = config.block_tokens / config.page_size;
  const double share = absl::GetFlag(FLAGS_share);
  const int64_t device = config.l1_blocks * pages_per_block;
  const int64_t host = config.l2_blocks * pages_per_block;
  const auto b_device = static_cast<int64_t>(share * device);
  const double host_share = absl::GetFlag(FLAGS_host_share) < 0
                                ? share
                                : absl::GetFlag(FLAGS_host_share);
  const auto b_host = static_cast<int64_t>(host_share * host);
  struct Scenario {
    const char* name;
    const std::vector<TraceRequest>* trace;
    std::vector<NamespaceQuota> quotas;
  };
  const std::vector<Scenario> scenarios = {
      {"alone", &*b, {}},
      {"flood", &flooded, {}},
      {"guaranteed", &flooded,
       {{.ns = "b", .device_guaranteed = b_device, .host_guaranteed = b_host}}},
      {"limited", &flooded,
       {{.ns = "a",
         .device_limit = device - b_device,
         .host_limit = host - b_host}}},
      {"both", &flooded,
       {{.ns = "a",
         .device_limit = device - b_device,
         .host_limit = host - b_host},
        {.ns = "b", .device_guaranteed = b_device, .host_guaranteed = b_host}}},
  };
  std::printf("tenant b: %zu requests of %s; a floods %lld fresh blocks after "
              "each; L1 %lld / L2 %lld blocks; b's share %.0f%%\n",
              b->size(), path.c_str(),
              static_cast<long long>(absl::GetFlag(FLAGS_flood_blocks)),
              static_cast<long long>(config.l1_blocks),
              static_cast<long long>(config.l2_blocks), 100 * share);
  std::printf("%-11s %10s %12s %10s %22s %22s\n", "scenario", "b L1+L2",
              "vs alone", "breaches", "b min device pages", "b min host pages");
  double alone = 0;
  int exit_code = 0;
  for (const Scenario& s : scenarios) {
    config.namespace_quotas = s.quotas;
    absl::StatusOr<ReplayOutcome> out = ReplayTrace(*s.trace, config);
    if (!out.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name, out.status().ToString().c_str());
      return 1;
    }
    const NamespaceOutcome& mine = out->namespaces["b"];
    const double rate = 100 * mine.l12_rate();
    if (s.trace == &*b) alone = rate;
    std::printf("%-11s %9.2f%% %+11.2f %10lld %22s %22s\n", s.name, rate,
                rate - alone, static_cast<long long>(mine.guarantee_breaches),
                mine.min_device_pages_once_guaranteed < 0
                    ? "-"
                    : absl::StrFormat("%d (>= %d)",
                                      mine.min_device_pages_once_guaranteed,
                                      b_device)
                          .c_str(),
                mine.min_host_pages_once_guaranteed < 0
                    ? "-"
                    : absl::StrFormat("%d (>= %d)",
                                      mine.min_host_pages_once_guaranteed,
                                      b_host)
                          .c_str());
    if (mine.guarantee_breaches > 0) exit_code = 1;
  }
  return exit_code;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Main();
}
