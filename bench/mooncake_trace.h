#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hicache {

// One request of a Mooncake-format trace (one JSON object per line):
// {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}.
// Hash ids are prefix-chained, one per `block_tokens` block of the input.
struct TraceRequest {
  int64_t timestamp_ms = 0;
  int64_t input_length = 0;
  int64_t output_length = 0;
  std::vector<int64_t> hash_ids;
  // The tenant (replays only; not in the trace format): "" by default.
  std::string ns;
};

// `flag` if non-empty, else the repository's copy of the public Mooncake
// trace ($BUILD_WORKSPACE_DIRECTORY/bench/traces/mooncake_synthetic.jsonl
// under `bazel run`).
std::string TracePathOrDefault(const std::string& flag);

// Reads up to `limit` requests (-1 = all). INVALID_ARGUMENT names the line of
// a malformed record; NOT_FOUND when the file cannot be opened.
absl::StatusOr<std::vector<TraceRequest>> ReadMooncakeTrace(
    const std::string& path, int64_t limit = -1);

// Token ids of a request: block h becomes [h*block, h*block + block).
std::vector<int32_t> TraceTokens(const TraceRequest& request,
                                 int64_t block_tokens = 512);
// The same into `out` (reusing its capacity).
void TraceTokensInto(const TraceRequest& request, int64_t block_tokens,
                     std::vector<int32_t>* out);

}  // namespace hicache
