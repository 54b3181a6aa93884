// Replays a Mooncake trace through the radix tree in-process: for each
// request in order, MatchPrefix then Insert of its full token list (no
// eviction, P = 64). Reports query tokens per second of match+insert time,
// p50/p99 of each call, and RSS growth per cached token.
//
//   bazel run --config=opt //bench:radix_replay --
//       --trace=$PWD/bench/traces/mooncake_synthetic.jsonl --requests=2000
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench/percentile.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/mooncake_trace.h"
#include "daemon/radix/radix_tree.h"

ABSL_FLAG(std::string, trace, "", "Mooncake trace (JSON lines).");
ABSL_FLAG(int64_t, requests, -1, "Replay at most this many requests (-1 all).");
ABSL_FLAG(int64_t, block_tokens, 512, "Tokens per hash id.");
ABSL_FLAG(uint32_t, page_size, 64, "Radix page size.");
ABSL_FLAG(int64_t, reserve_tokens, 0,
          "Token storage to map and pre-fault up front, as the daemon does "
          "for its pool capacity (counted in the RSS growth).");

namespace hicache {
namespace {

int64_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int Run() {
  const std::string path = TracePathOrDefault(absl::GetFlag(FLAGS_trace));
  auto trace = ReadMooncakeTrace(path, absl::GetFlag(FLAGS_requests));
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
    return 1;
  }
  const int64_t block = absl::GetFlag(FLAGS_block_tokens);
  const uint32_t page = absl::GetFlag(FLAGS_page_size);
  std::vector<std::vector<int32_t>> requests;
  for (const TraceRequest& r : *trace)
    requests.push_back(TraceTokens(r, block));

  const int64_t rss_before = RssBytes();
  auto tree = *RadixTree::Create(
      {.page_size = page,
       .cp_size = 1,
       .reserve_tokens = absl::GetFlag(FLAGS_reserve_tokens)});
  using Clock = std::chrono::steady_clock;
  std::vector<double> match_us, insert_us;
  int64_t query_tokens = 0, hit_tokens = 0;
  LogicalPage next_page = 1;
  std::vector<LogicalPage> pages;
  double busy_s = 0;
  // Each request's tokens are materialized just before its calls, as a
  // scheduler holds a request it has just received (outside the timing), in
  // a reused buffer.
  std::vector<int32_t> tokens;
  for (const TraceRequest& request : *trace) {
    TraceTokensInto(request, block, &tokens);
    pages.resize((tokens.size() + page - 1) / page);
    for (auto& p : pages) p = next_page++;
    const auto t0 = Clock::now();
    auto match = tree->MatchPrefix("", tokens);
    const auto t1 = Clock::now();
    auto insert = tree->Insert("", tokens, pages);
    const auto t2 = Clock::now();
    if (!match.ok() || !insert.ok()) {
      std::fprintf(stderr, "tree error\n");
      return 1;
    }
    match_us.push_back(
        std::chrono::duration<double, std::micro>(t1 - t0).count());
    insert_us.push_back(
        std::chrono::duration<double, std::micro>(t2 - t1).count());
    busy_s += std::chrono::duration<double>(t2 - t0).count();
    query_tokens += tokens.size();
    hit_tokens += match->device_len;
  }
  const int64_t rss_after = RssBytes();
  const TreeStats stats = tree->Stats();
  std::printf("requests              %zu\n", trace->size());
  std::printf("query tokens          %lld\n",
              static_cast<long long>(query_tokens));
  std::printf("hit rate (tokens)     %.2f%%\n",
              100.0 * hit_tokens / query_tokens);
  std::printf("throughput            %.1f M query tokens/s (match+insert)\n",
              query_tokens / busy_s / 1e6);
  double match_total = 0, insert_total = 0;
  for (double v : match_us) match_total += v;
  for (double v : insert_us) insert_total += v;
  std::printf("time in match/insert  %.1f / %.1f ms\n", match_total / 1000,
              insert_total / 1000);
  std::printf("match  p50 / p99      %.2f / %.2f us\n",
              Percentile(match_us, 0.5), Percentile(match_us, 0.99));
  std::printf("insert p50 / p99      %.2f / %.2f us\n",
              Percentile(insert_us, 0.5), Percentile(insert_us, 0.99));
  std::printf("cached tokens         %lld in %lld nodes\n",
              static_cast<long long>(stats.device_tokens),
              static_cast<long long>(stats.nodes));
  std::printf(
      "RSS growth            %.2f bytes per cached token\n",
      static_cast<double>(rss_after - rss_before) / stats.device_tokens);
  return 0;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Run();
}
