#pragma once

// A synthetic multi-turn conversation workload in Mooncake trace format
// (bench/mooncake_trace.h): one request per conversation turn, hash ids one
// per `block_tokens` block of the input, prefix-chained.
//
// The shape:
//  - `system_prompts` system prompts of `system_prompt_tokens` tokens each.
//    Their full blocks have the same ids in every conversation that starts
//    with them (ids 0 .. system_prompts * full_blocks - 1).
//  - `conversations` conversation slots. Each request picks a slot by a Zipf
//    law of exponent `zipf_s` over slot ranks (slot 0 is the most popular:
//    P(slot k) ~ (k + 1)^-s). The slot's conversation then takes a turn:
//      turn 0:  input = system prompt + user message
//      turn t:  input = previous input + previous output + user message
//    User messages are uniform in [min_user_tokens, max_user_tokens] tokens,
//    outputs uniform in [min_output_tokens, max_output_tokens]. A slot whose
//    conversation has had `max_turns` turns starts a fresh conversation
//    (new conversation id, new ids, a system prompt drawn uniformly).
//  - Ids as Mooncake emits them: the full blocks of the previous turn's
//    input keep their ids; every later block, including the previous turn's
//    last partial block (its content changes as it fills), gets a new id.
//    New ids are handed out in increasing order, so an id stands for its
//    block and everything before it: equal ids imply equal prefixes, and
//    every id has one parent.
//  - Arrivals are a Poisson process: exponential gaps of mean
//    `mean_interarrival_ms` after the first request (at 0); timestamps are
//    the arrival times rounded down to whole milliseconds, non-decreasing.
//
// Determinism: the output depends only on the options. All sampling is
// done here from raw std::mt19937_64 draws (no <random> distributions, no
// libm logarithms or powers: those are computed with IEEE basic operations
// and exact scalings only, and the library is built with
// -ffp-contract=off), so a seed gives the same bytes with every compiler
// and standard library.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/mooncake_trace.h"

namespace hicache {

// The defaults make bench/traces/conversations.jsonl (seed 1). 16,000
// requests over 2,000 slots give ~58k unique blocks, ~3x an 18,000-block
// cache (the Mooncake trace has 43,924); with 4,000 requests over 200 slots
// all ~15k unique blocks fit and every cache above 6,000 blocks hits like
// an infinite one. bench/traces/README.md has the figures.
struct ConversationTraceOptions {
  uint64_t seed = 1;
  int64_t requests = 16000;
  int64_t conversations = 2000;
  double zipf_s = 1.0;
  int64_t system_prompts = 2;
  int64_t system_prompt_tokens = 2048;
  int64_t min_user_tokens = 200;
  int64_t max_user_tokens = 2000;
  int64_t min_output_tokens = 100;
  int64_t max_output_tokens = 600;
  int64_t max_turns = 12;
  int64_t block_tokens = 512;
  double mean_interarrival_ms = 256;
};

// One generated request and where it came from.
struct ConversationRequest {
  TraceRequest request;
  int64_t slot = 0;           // Zipf rank of the slot, 0 = most popular
  int64_t conversation = 0;   // 0, 1, ... in order of first turn
  int64_t turn = 0;           // 0 .. max_turns - 1
  int64_t system_prompt = 0;  // 0 .. system_prompts - 1
};

// INVALID_ARGUMENT naming the first bad option (counts < 1 where they
// must be positive, empty or negative ranges, a negative exponent or
// arrival gap, ...).
absl::Status ValidateConversationTraceOptions(
    const ConversationTraceOptions& options);

absl::StatusOr<std::vector<ConversationRequest>> GenerateConversationTrace(
    const ConversationTraceOptions& options);

// One Mooncake record, without the newline, in the shared trace's spelling:
//   {"timestamp": 0, "input_length": 900, "output_length": 6,
//    "hash_ids": [0, 1]}
// (on one line).
std::string MooncakeLine(const TraceRequest& request);

// Every request's MooncakeLine, one per line.
void WriteMooncakeTrace(const std::vector<ConversationRequest>& trace,
                        std::ostream& out);

}  // namespace hicache
