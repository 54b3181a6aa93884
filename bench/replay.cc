// In-process replay of a Mooncake trace through the HiCache engine, as a
// scheduler would drive it: load-back (match + host hits), allocate and
// "compute" the rest, back up per layer (write_through), insert, attach.
// Capacities are given in blocks of --block_tokens tokens. Reports per block:
// L1 hit rate, L1+L2 hit rate (a request's walk stops at its first block
// missing from both tiers), backups, loads and evictions, for each policy.
//
//   bazel run --config=opt //bench:replay -- --l1_blocks=6000 --l2_blocks=12000
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/mooncake_trace.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/policies.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, trace, "",
          "Mooncake trace (default: ../shared/traces/synthetic_trace.jsonl).");
ABSL_FLAG(int64_t, requests, -1, "Replay at most this many requests.");
ABSL_FLAG(int64_t, block_tokens, 512, "Tokens per hash id.");
ABSL_FLAG(int64_t, l1_blocks, 6000, "Device (L1) capacity in blocks.");
ABSL_FLAG(int64_t, l2_blocks, 12000, "Host (L2) capacity in blocks.");
ABSL_FLAG(std::string, policies, "lru,lfu,fifo,priority,slru",
          "Eviction policies to run.");
ABSL_FLAG(hicache::WritePolicy, write_policy,
          hicache::WritePolicy::kWriteThrough,
          "write_through, write_through_selective or write_back.");

namespace hicache {
namespace {

struct Outcome {
  int64_t blocks = 0, l1_blocks = 0, l12_blocks = 0;
  EngineStats stats;
  double seconds = 0;
};

absl::StatusOr<Outcome> Replay(const std::vector<TraceRequest>& trace,
                               EvictionPolicy policy, WritePolicy write) {
  const int64_t block = absl::GetFlag(FLAGS_block_tokens);
  const uint32_t page = 64;
  const int64_t pages_per_block = block / page;
  // The daemon's configuration of this replay, converted as hicached does.
  DaemonConfig config;
  config.page_size = page;
  config.cp_size = 1;
  config.kv_preset = "micro";
  config.device_pages_per_rank =
      1 + absl::GetFlag(FLAGS_l1_blocks) * pages_per_block;
  config.host_pages_per_rank = absl::GetFlag(FLAGS_l2_blocks) * pages_per_block;
  config.write_policy = write;
  config.write_through_threshold = 2;
  config.eviction_policy = policy;
  config.transfer_workers = 1;
  if (absl::Status valid = config.Validate(); !valid.ok()) return valid;
  auto engine = HiCacheEngine::Create(EngineOptionsFrom(config));
  if (!engine.ok()) return engine.status();
  HiCacheEngine& e = **engine;
  Outcome out;
  const absl::Time start = absl::Now();
  for (const TraceRequest& request : trace) {
    const std::vector<int32_t> tokens = TraceTokens(request, block);
    const int64_t n = tokens.size();
    absl::StatusOr<LoadResult> load = e.LoadBack("", tokens);
    if (!load.ok()) return load.status();
    int64_t loaded = load->loaded_len;
    if (load->op_id != 0) {
      absl::StatusOr<bool> done;
      while ((done = e.LoadDone(load->op_id)).ok() && !*done) {
        e.WaitForTransfers();
      }
      if (!done.ok()) loaded = 0;  // A failed load is a miss.
    }
    out.blocks += request.hash_ids.size();
    out.l1_blocks += load->device_len / block;
    out.l12_blocks += (load->device_len + loaded) / block;
    const int64_t reuse = (load->device_len + loaded) / page;
    std::vector<LogicalPage> pages(load->pages.begin(),
                                   load->pages.begin() + reuse);
    const int64_t need = (n + page - 1) / page - reuse;
    bool ok = true;
    if (need > 0) {
      auto fresh = e.Allocate(need);
      ok = fresh.ok();
      if (ok) pages.insert(pages.end(), fresh->begin(), fresh->end());
    }
    if (ok) {
      uint64_t op = 0;
      if (need > 0 && write == WritePolicy::kWriteThrough) {
        std::vector<LogicalPage> fresh(pages.begin() + reuse, pages.end());
        auto ops = e.PrepareBackups({BackupSpec{fresh, n - reuse * page}});
        if (ops.ok() && (*ops)[0] != 0) {
          op = (*ops)[0];
          (void)e.StoreAllLayers(op);
        }
      }
      auto inserted = e.Insert("", tokens, pages);
      if (!inserted.ok()) return inserted.status();
      if (op != 0 &&
          (inserted->deferred || !e.AttachBackup(op, inserted->node).ok())) {
        (void)e.RollbackBackup(op);
      }
      if (!inserted->uncached_pages.empty())
        (void)e.Free(inserted->uncached_pages);
    }
    if (load->op_id != 0) {
      (void)e.FinishLoad(load->op_id);
    } else {
      (void)e.Unlock(load->node);
    }
  }
  e.WaitForTransfers();
  out.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  out.stats = e.Stats();
  if (absl::Status s = e.CheckInvariants(); !s.ok()) return s;
  return out;
}

int Main() {
  spdlog::set_level(spdlog::level::err);
  const std::string path = TracePathOrDefault(absl::GetFlag(FLAGS_trace));
  auto trace = ReadMooncakeTrace(path, absl::GetFlag(FLAGS_requests));
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  const WritePolicy write = absl::GetFlag(FLAGS_write_policy);
  std::printf("trace %s: %zu requests; L1 %lld blocks, L2 %lld blocks; %s\n",
              path.c_str(), trace->size(),
              static_cast<long long>(absl::GetFlag(FLAGS_l1_blocks)),
              static_cast<long long>(absl::GetFlag(FLAGS_l2_blocks)),
              std::string(PolicyName(write)).c_str());
  std::printf("%-9s %8s %9s %8s %8s %10s %10s %7s\n", "policy", "L1 hit",
              "L1+L2 hit", "backups", "loads", "L1 evict", "L2 evict", "secs");
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_policies), ',')) {
    auto policy = ParsePolicy<EvictionPolicy>(name);
    if (!policy.ok()) {
      std::fprintf(stderr, "%s\n",
                   std::string(policy.status().message()).c_str());
      return 2;
    }
    auto out = Replay(*trace, *policy, write);
    if (!out.ok()) {
      std::fprintf(stderr, "replay failed: %s\n",
                   out.status().ToString().c_str());
      return 1;
    }
    const int64_t pages_per_block = absl::GetFlag(FLAGS_block_tokens) / 64;
    std::printf(
        "%-9s %7.2f%% %8.2f%% %8lld %8lld %10lld %10lld %7.1f\n",
        std::string(name).c_str(), 100.0 * out->l1_blocks / out->blocks,
        100.0 * out->l12_blocks / out->blocks,
        static_cast<long long>(out->stats.backups_committed),
        static_cast<long long>(out->stats.loads_done),
        static_cast<long long>(out->stats.device_evicted_pages /
                               pages_per_block),
        static_cast<long long>(out->stats.host_evicted_pages / pages_per_block),
        out->seconds);
  }
  return 0;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Main();
}
