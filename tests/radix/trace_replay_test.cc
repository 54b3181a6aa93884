// Replays the first 300 requests of the public Mooncake trace (bundled in
// tests/data) through the tree and checks every hit against a naive count:
// hash ids are prefix-chained, so a request's hit is exactly its leading
// blocks whose ids were seen before.
#include <fstream>
#include <set>

#include "bench/mooncake_trace.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(TraceReplayTest, HitsEqualTheNaiveBlockCount) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const std::string path = std::string(srcdir ? srcdir : ".") +
                           "/hicache/tests/data/mooncake_head300.jsonl";
  auto trace = ReadMooncakeTrace(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 300u);
  auto tree = *RadixTree::Create({.page_size = 64, .cp_size = 1});
  std::set<int64_t> seen;
  LogicalPage next_page = 1;
  int64_t hit_blocks = 0, blocks = 0;
  for (const TraceRequest& request : *trace) {
    const std::vector<int32_t> tokens = TraceTokens(request);
    int64_t expected = 0;
    while (expected < static_cast<int64_t>(request.hash_ids.size()) &&
           seen.count(request.hash_ids[expected])) {
      ++expected;
    }
    auto match = tree->MatchPrefix("", tokens);
    ASSERT_TRUE(match.ok());
    ASSERT_EQ(match->device_len, expected * 512);
    std::vector<LogicalPage> pages(tokens.size() / 64);
    for (auto& p : pages) p = next_page++;
    auto insert = tree->Insert("", tokens, pages);
    ASSERT_TRUE(insert.ok());
    ASSERT_EQ(insert->present_len, expected * 512);
    ASSERT_EQ(static_cast<int64_t>(insert->duplicate_pages.size()),
              expected * 8);
    seen.insert(request.hash_ids.begin(), request.hash_ids.end());
    hit_blocks += expected;
    blocks += request.hash_ids.size();
  }
  ASSERT_TRUE(tree->CheckInvariants().ok());
  EXPECT_EQ(tree->Stats().device_tokens,
            static_cast<int64_t>(seen.size()) * 512);
  RecordProperty("hit_blocks", static_cast<int>(hit_blocks));
  RecordProperty("blocks", static_cast<int>(blocks));
}

TEST(TraceReplayTest, BadTracesAreClearErrors) {
  EXPECT_EQ(ReadMooncakeTrace("/nonexistent.jsonl").status().code(),
            absl::StatusCode::kNotFound);
  const std::string path =
      std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR")
                                             : "/tmp") +
      "/bad.jsonl";
  std::ofstream(path)
      << "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, "
         "\"hash_ids\": [1]}\n{\"timestamp\": 1}\n";
  auto trace = ReadMooncakeTrace(path);
  EXPECT_EQ(trace.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(trace.status().message().find("bad.jsonl:2"), std::string::npos)
      << trace.status();
}

}  // namespace
}  // namespace hicache
