// Prints the hit-rate bounds of a Mooncake-format trace (bench/cache_bound.h):
// per capacity the LRU rate and the Belady-with-bypass bound, and the
// infinite-cache rate, all in blocks.
//
//   bazel run --config=opt //bench:cache_bound --
//       --trace=PATH --capacities=6000,12000,18000 [--json]
//
// The default trace is bench/traces/mooncake_synthetic.jsonl (the public
// Mooncake trace). --json prints one JSON object instead of the table.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/cache_bound.h"
#include "bench/mooncake_trace.h"

ABSL_FLAG(std::string, trace, "", "Mooncake trace (JSON lines).");
ABSL_FLAG(std::vector<std::string>, capacities,
          std::vector<std::string>({"6000", "12000", "18000"}),
          "Cache capacities in blocks, comma-separated.");
ABSL_FLAG(int64_t, requests, -1, "Read at most this many requests (-1 all).");
ABSL_FLAG(bool, json, false, "Print one JSON object instead of a table.");

namespace hicache {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonResult(const CacheBoundResult& r) {
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%.6f", r.rate());
  return absl::StrCat("{\"hit_blocks\": ", r.hit_blocks, ", \"rate\": ", rate,
                      "}");
}

int Run() {
  std::vector<int64_t> capacities;
  for (const std::string& text : absl::GetFlag(FLAGS_capacities)) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(text, &value) || value < 0) {
      std::fprintf(stderr, "bad capacity '%s'\n", text.c_str());
      return 2;
    }
    capacities.push_back(value);
  }
  const std::string path = TracePathOrDefault(absl::GetFlag(FLAGS_trace));
  auto requests = ReadMooncakeTrace(path, absl::GetFlag(FLAGS_requests));
  if (!requests.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(requests.status().message()).c_str());
    return 1;
  }
  const BlockTrace trace = BlockTrace::Build(*requests);
  const CacheBoundResult infinite = InfiniteRate(trace);
  std::vector<CacheBoundResult> lru, belady;
  for (int64_t c : capacities) {
    lru.push_back(LruRate(trace, c));
    belady.push_back(BeladyBound(trace, c));
  }

  if (absl::GetFlag(FLAGS_json)) {
    std::vector<std::string> rows;
    for (size_t i = 0; i < capacities.size(); ++i) {
      rows.push_back(absl::StrCat(
          "{\"capacity\": ", capacities[i], ", \"lru\": ", JsonResult(lru[i]),
          ", \"belady\": ", JsonResult(belady[i]), "}"));
    }
    std::printf(
        "%s\n",
        absl::StrCat("{\"trace\": ", JsonString(path),
                     ", \"requests\": ", trace.num_requests(),
                     ", \"blocks\": ", trace.total_blocks(),
                     ", \"unique_blocks\": ", trace.unique_blocks(),
                     ", \"infinite\": ", JsonResult(infinite),
                     ", \"capacities\": [", absl::StrJoin(rows, ", "), "]}")
            .c_str());
    return 0;
  }
  std::printf("trace          %s\n", path.c_str());
  std::printf("requests       %lld\n",
              static_cast<long long>(trace.num_requests()));
  std::printf("blocks         %lld (%lld unique)\n",
              static_cast<long long>(trace.total_blocks()),
              static_cast<long long>(trace.unique_blocks()));
  std::printf("\n%10s %10s %10s %10s\n", "capacity", "LRU", "Belady",
              "infinite");
  for (size_t i = 0; i < capacities.size(); ++i) {
    std::printf("%10lld %9.2f%% %9.2f%% %9.2f%%\n",
                static_cast<long long>(capacities[i]), 100 * lru[i].rate(),
                100 * belady[i].rate(), 100 * infinite.rate());
  }
  return 0;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Run();
}
