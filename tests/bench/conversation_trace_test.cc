// bench/conversation_trace: determinism (and the committed
// bench/traces/conversations.jsonl is exactly the default output), the
// prefix-chaining of the ids, how turns extend each other, block counts, the
// Zipf skew of the slots, the arrivals and the option checks.
#include "bench/conversation_trace.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench/mooncake_trace.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using Trace = std::vector<ConversationRequest>;

Trace Generate(const ConversationTraceOptions& options) {
  auto trace = GenerateConversationTrace(options);
  EXPECT_TRUE(trace.ok()) << trace.status();
  return trace.ok() ? *std::move(trace) : Trace{};
}

std::string Text(const Trace& trace) {
  std::ostringstream out;
  WriteMooncakeTrace(trace, out);
  return out.str();
}

ConversationTraceOptions Small() {
  ConversationTraceOptions o;
  o.requests = 3000;
  o.conversations = 100;
  return o;
}

TEST(ConversationTraceTest, SameSeedSameBytesOtherSeedOtherBytes) {
  ConversationTraceOptions o = Small();
  const std::string a = Text(Generate(o));
  EXPECT_EQ(a, Text(Generate(o)));
  o.seed = 2;
  EXPECT_NE(a, Text(Generate(o)));
}

TEST(ConversationTraceTest, CommittedTraceIsTheDefaultOutput) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::ifstream in(std::string(srcdir ? srcdir : ".") +
                   "/hicache/bench/traces/conversations.jsonl");
  ASSERT_TRUE(in) << "bench/traces/conversations.jsonl not in runfiles";
  const Trace trace = Generate(ConversationTraceOptions{});
  ASSERT_EQ(trace.size(), 16000u);
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ASSERT_LT(n, trace.size()) << "the file has more lines";
    ASSERT_EQ(line, MooncakeLine(trace[n].request)) << "line " << n + 1;
    ++n;
  }
  EXPECT_EQ(n, trace.size());
}

TEST(ConversationTraceTest, MooncakeLineReadsBack) {
  const Trace trace = Generate(Small());
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/conversations.jsonl";
  {
    std::ofstream out(path);
    WriteMooncakeTrace(trace, out);
  }
  auto back = ReadMooncakeTrace(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    EXPECT_EQ((*back)[i].timestamp_ms, trace[i].request.timestamp_ms);
    EXPECT_EQ((*back)[i].input_length, trace[i].request.input_length);
    EXPECT_EQ((*back)[i].output_length, trace[i].request.output_length);
    EXPECT_EQ((*back)[i].hash_ids, trace[i].request.hash_ids);
  }
  EXPECT_EQ(MooncakeLine(trace[0].request).substr(0, 15), "{\"timestamp\": 0");
}

// Every id has one parent (the id before it; -1 for a first block).
void ExpectTree(const Trace& trace) {
  std::map<int64_t, int64_t> parent;
  for (const ConversationRequest& r : trace) {
    int64_t before = -1;
    for (int64_t id : r.request.hash_ids) {
      auto [it, inserted] = parent.try_emplace(id, before);
      ASSERT_EQ(it->second, before) << "id " << id << " has two parents";
      before = id;
    }
  }
}

TEST(ConversationTraceTest, IdsFormATree) {
  ExpectTree(Generate(Small()));
  ConversationTraceOptions o = Small();
  o.system_prompt_tokens = 1000;  // a partial system-prompt block
  o.system_prompts = 5;
  ExpectTree(Generate(o));
}

TEST(ConversationTraceTest, OneIdPerBlockAndLengthsInRange) {
  ConversationTraceOptions o = Small();
  o.block_tokens = 256;
  for (const ConversationTraceOptions& opts : {Small(), o}) {
    for (const ConversationRequest& r : Generate(opts)) {
      const int64_t b = opts.block_tokens;
      EXPECT_EQ(static_cast<int64_t>(r.request.hash_ids.size()),
                (r.request.input_length + b - 1) / b);
      EXPECT_GE(r.request.output_length, opts.min_output_tokens);
      EXPECT_LE(r.request.output_length, opts.max_output_tokens);
      EXPECT_GE(r.turn, 0);
      EXPECT_LT(r.turn, opts.max_turns);
      EXPECT_GE(r.slot, 0);
      EXPECT_LT(r.slot, opts.conversations);
    }
  }
}

// Turn t keeps turn t-1's full blocks, its input is turn t-1's input and
// output plus a user message, and every later block has an id never seen
// before. Turn 0 is the system prompt's shared blocks plus new ids.
void ExpectTurnsExtend(const ConversationTraceOptions& o) {
  const Trace trace = Generate(o);
  const int64_t b = o.block_tokens;
  const int64_t prompt_blocks = o.system_prompt_tokens / b;
  std::map<int64_t, const ConversationRequest*> last;  // by conversation
  std::set<int64_t> seen;
  int64_t max_seen = -1;
  int64_t later_turns = 0;
  for (const ConversationRequest& r : trace) {
    const auto& ids = r.request.hash_ids;
    int64_t kept = 0, prefix_tokens = 0;
    auto it = last.find(r.conversation);
    if (r.turn == 0) {
      ASSERT_TRUE(it == last.end()) << "conversation " << r.conversation;
      ASSERT_GE(r.system_prompt, 0);
      ASSERT_LT(r.system_prompt, o.system_prompts);
      kept = prompt_blocks;
      prefix_tokens = o.system_prompt_tokens;
      for (int64_t i = 0; i < kept; ++i) {
        ASSERT_EQ(ids[i], r.system_prompt * prompt_blocks + i);
      }
    } else {
      ASSERT_TRUE(it != last.end()) << "conversation " << r.conversation;
      const ConversationRequest& prev = *it->second;
      ASSERT_EQ(r.turn, prev.turn + 1);
      ASSERT_EQ(r.slot, prev.slot);
      ASSERT_EQ(r.system_prompt, prev.system_prompt);
      kept = prev.request.input_length / b;
      prefix_tokens = prev.request.input_length + prev.request.output_length;
      ASSERT_TRUE(std::equal(ids.begin(), ids.begin() + kept,
                             prev.request.hash_ids.begin()));
      ++later_turns;
    }
    const int64_t user = r.request.input_length - prefix_tokens;
    ASSERT_GE(user, o.min_user_tokens);
    ASSERT_LE(user, o.max_user_tokens);
    for (size_t i = kept; i < ids.size(); ++i) {
      ASSERT_FALSE(seen.count(ids[i])) << "id " << ids[i] << " reused";
      ASSERT_GT(ids[i], max_seen) << "new ids come in increasing order";
      max_seen = ids[i];
    }
    seen.insert(ids.begin(), ids.end());
    last[r.conversation] = &r;
  }
  EXPECT_GT(later_turns, static_cast<int64_t>(trace.size()) / 2);
}

TEST(ConversationTraceTest, EachTurnExtendsThePreviousByItsFullBlocks) {
  ExpectTurnsExtend(Small());
  ConversationTraceOptions o = Small();
  o.system_prompt_tokens = 1000;
  o.block_tokens = 128;
  o.min_output_tokens = 0;
  o.system_prompts = 3;
  ExpectTurnsExtend(o);
}

TEST(ConversationTraceTest, SystemPromptBlocksAreSharedAcrossConversations) {
  const Trace trace = Generate(Small());
  std::map<int64_t, std::set<int64_t>> conversations_per_prompt;
  for (const ConversationRequest& r : trace) {
    conversations_per_prompt[r.system_prompt].insert(r.conversation);
  }
  ASSERT_EQ(conversations_per_prompt.size(), 2u);
  for (const auto& [prompt, conversations] : conversations_per_prompt) {
    EXPECT_GT(conversations.size(), 50u) << "prompt " << prompt;
  }
}

TEST(ConversationTraceTest, FullConversationsRestartWithNewIds) {
  ConversationTraceOptions o;
  o.requests = 7;
  o.conversations = 1;
  o.max_turns = 3;
  const Trace trace = Generate(o);
  const std::vector<int64_t> turns = {0, 1, 2, 0, 1, 2, 0};
  const std::vector<int64_t> conversations = {0, 0, 0, 1, 1, 1, 2};
  for (size_t i = 0; i < trace.size(); ++i) {
    EXPECT_EQ(trace[i].turn, turns[i]);
    EXPECT_EQ(trace[i].conversation, conversations[i]);
  }
  // The fresh conversation shares only the system prompt (4 blocks).
  const auto& a = trace[2].request.hash_ids;
  const auto& b = trace[3].request.hash_ids;
  const size_t common =
      std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin();
  EXPECT_LE(common, 4u);
}

std::vector<int64_t> SlotCounts(const Trace& trace, int64_t slots) {
  std::vector<int64_t> count(slots, 0);
  for (const ConversationRequest& r : trace) ++count[r.slot];
  return count;
}

TEST(ConversationTraceTest, SlotPopularityIsZipf) {
  const ConversationTraceOptions o;  // 16,000 requests, 2,000 slots, s = 1
  const std::vector<int64_t> count = SlotCounts(Generate(o), o.conversations);
  std::vector<int64_t> sorted = count;
  std::sort(sorted.begin(), sorted.end());
  const int64_t median = std::max<int64_t>(sorted[sorted.size() / 2], 1);
  EXPECT_GT(count[0], 100 * median);
  EXPECT_EQ(count[0], sorted.back());
  double harmonic = 0;
  for (int k = 1; k <= o.conversations; ++k) harmonic += 1.0 / k;
  const double expected_top = o.requests / harmonic;  // ~1,956
  EXPECT_NEAR(count[0], expected_top, 0.1 * expected_top);
  EXPECT_NEAR(static_cast<double>(count[0]) / count[1], 2.0, 0.3);
  EXPECT_NEAR(static_cast<double>(count[0]) / count[3], 4.0, 0.6);
}

TEST(ConversationTraceTest, OtherExponents) {
  ConversationTraceOptions o;
  o.requests = 20000;
  o.conversations = 10;
  o.zipf_s = 2.0;  // P(rank 1) = 1 / (sum k^-2, k <= 10) = 0.6452
  std::vector<int64_t> count = SlotCounts(Generate(o), o.conversations);
  EXPECT_NEAR(count[0] / 20000.0, 0.6452, 0.015);
  EXPECT_NEAR(count[1] / 20000.0, 0.6452 / 4, 0.01);
  o.zipf_s = 0.0;  // uniform
  count = SlotCounts(Generate(o), o.conversations);
  for (int64_t c : count) EXPECT_NEAR(c / 20000.0, 0.1, 0.01);
}

TEST(ConversationTraceTest, PoissonArrivals) {
  ConversationTraceOptions o = Small();
  o.requests = 20000;
  o.mean_interarrival_ms = 100;
  const Trace trace = Generate(o);
  EXPECT_EQ(trace.front().request.timestamp_ms, 0);
  int64_t within_mean = 0;
  for (size_t i = 1; i < trace.size(); ++i) {
    const int64_t gap =
        trace[i].request.timestamp_ms - trace[i - 1].request.timestamp_ms;
    ASSERT_GE(gap, 0);
    if (gap < 100) ++within_mean;
  }
  const double mean =
      static_cast<double>(trace.back().request.timestamp_ms) / (o.requests - 1);
  EXPECT_NEAR(mean, 100, 3);
  // Exponential: P(gap < mean) = 1 - 1/e = 0.632 (whole ms shift it by
  // at most ~1%).
  EXPECT_NEAR(static_cast<double>(within_mean) / (o.requests - 1), 0.632, 0.02);
}

TEST(ConversationTraceTest, RejectsBadOptions) {
  auto bad = [](auto change) {
    ConversationTraceOptions o;
    change(o);
    return GenerateConversationTrace(o).status().code() ==
           absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(bad([](auto& o) { o.conversations = 0; }));
  EXPECT_TRUE(bad([](auto& o) { o.requests = -1; }));
  EXPECT_TRUE(bad([](auto& o) { o.zipf_s = -0.5; }));
  EXPECT_TRUE(bad([](auto& o) { o.system_prompts = 0; }));
  EXPECT_TRUE(bad([](auto& o) { o.min_user_tokens = 0; }));
  EXPECT_TRUE(bad([](auto& o) { o.min_user_tokens = 3000; }));
  EXPECT_TRUE(bad([](auto& o) { o.min_output_tokens = 700; }));
  EXPECT_TRUE(bad([](auto& o) { o.max_turns = 0; }));
  EXPECT_TRUE(bad([](auto& o) { o.block_tokens = 0; }));
  EXPECT_TRUE(bad([](auto& o) { o.mean_interarrival_ms = -1; }));
  EXPECT_TRUE(ValidateConversationTraceOptions({}).ok());
  ConversationTraceOptions empty;
  empty.requests = 0;
  EXPECT_TRUE(Generate(empty).empty());
}

}  // namespace
}  // namespace hicache
