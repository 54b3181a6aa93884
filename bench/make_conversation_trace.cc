// Writes a synthetic multi-turn conversation trace in Mooncake format
// (bench/conversation_trace.h states the shape and the determinism).
//
//   bazel run --config=opt //bench:make_conversation_trace --
//       --seed=1 --out=$PWD/bench/traces/conversations.jsonl
//
// Without --out the trace goes to stdout. A summary (requests, blocks,
// conversations) goes to stderr.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/conversation_trace.h"

namespace {
constexpr hicache::ConversationTraceOptions kDefaults;
}  // namespace

ABSL_FLAG(uint64_t, seed, kDefaults.seed, "Random seed.");
ABSL_FLAG(int64_t, requests, kDefaults.requests, "Requests to generate.");
ABSL_FLAG(int64_t, conversations, kDefaults.conversations,
          "Conversation slots (Zipf ranks).");
ABSL_FLAG(double, zipf_s, kDefaults.zipf_s,
          "Zipf exponent of the slot popularity.");
ABSL_FLAG(int64_t, system_prompts, kDefaults.system_prompts,
          "Distinct system prompts.");
ABSL_FLAG(int64_t, system_prompt_tokens, kDefaults.system_prompt_tokens,
          "Tokens per system prompt.");
ABSL_FLAG(int64_t, min_user_tokens, kDefaults.min_user_tokens,
          "Shortest user message.");
ABSL_FLAG(int64_t, max_user_tokens, kDefaults.max_user_tokens,
          "Longest user message.");
ABSL_FLAG(int64_t, min_output_tokens, kDefaults.min_output_tokens,
          "Shortest output.");
ABSL_FLAG(int64_t, max_output_tokens, kDefaults.max_output_tokens,
          "Longest output.");
ABSL_FLAG(int64_t, max_turns, kDefaults.max_turns,
          "Turns after which a slot starts a fresh conversation.");
ABSL_FLAG(int64_t, block_tokens, kDefaults.block_tokens, "Tokens per hash id.");
ABSL_FLAG(double, mean_interarrival_ms, kDefaults.mean_interarrival_ms,
          "Mean gap of the Poisson arrivals.");
ABSL_FLAG(std::string, out, "", "Output file (default: stdout).");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  hicache::ConversationTraceOptions o;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.requests = absl::GetFlag(FLAGS_requests);
  o.conversations = absl::GetFlag(FLAGS_conversations);
  o.zipf_s = absl::GetFlag(FLAGS_zipf_s);
  o.system_prompts = absl::GetFlag(FLAGS_system_prompts);
  o.system_prompt_tokens = absl::GetFlag(FLAGS_system_prompt_tokens);
  o.min_user_tokens = absl::GetFlag(FLAGS_min_user_tokens);
  o.max_user_tokens = absl::GetFlag(FLAGS_max_user_tokens);
  o.min_output_tokens = absl::GetFlag(FLAGS_min_output_tokens);
  o.max_output_tokens = absl::GetFlag(FLAGS_max_output_tokens);
  o.max_turns = absl::GetFlag(FLAGS_max_turns);
  o.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  o.mean_interarrival_ms = absl::GetFlag(FLAGS_mean_interarrival_ms);
  auto trace = hicache::GenerateConversationTrace(o);
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
    return 2;
  }
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) {
    hicache::WriteMooncakeTrace(*trace, std::cout);
    std::cout.flush();
    if (!std::cout) return 1;
  } else {
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    hicache::WriteMooncakeTrace(*trace, file);
    file.close();
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  int64_t blocks = 0, conversations = 0;
  std::set<int64_t> unique;
  for (const auto& r : *trace) {
    blocks += r.request.hash_ids.size();
    unique.insert(r.request.hash_ids.begin(), r.request.hash_ids.end());
    conversations = std::max(conversations, r.conversation + 1);
  }
  std::fprintf(stderr,
               "%zu requests, %lld blocks (%zu unique), %lld conversations\n",
               trace->size(), static_cast<long long>(blocks), unique.size(),
               static_cast<long long>(conversations));
  return 0;
}
