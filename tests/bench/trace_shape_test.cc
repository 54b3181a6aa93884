#include "bench/trace_shape.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "bench/cache_bound.h"
#include "bench/mooncake_trace.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

TraceRequest Request(std::vector<int64_t> ids) {
  return TraceRequest{.input_length = static_cast<int64_t>(ids.size()) * 512,
                      .hash_ids = std::move(ids)};
}

// Counted by hand:
//   r0: 1 2 3     positions 0 1 2
//   r1: 1 2 4     positions 3 4 5   (1: distance 3, 2: distance 3)
//   r2: 5         position  6
//   r3: 1 2 3 6   positions 7..10   (1: 4, 2: 4, 3: 7)
// Blocks 1, 2, 3 are used more than once; 4, 5, 6 once: 3 of 6 unique,
// 3 of 11 references. Distances sorted: 3 3 4 4 7; nearest rank p25 = the
// 2nd = 3, p50 = the 3rd = 4, p75 = the 4th = 4, p90 = the 5th = 7. Blocks
// per request sorted 1 3 3 4: p50 = 3, p90 = p99 = 4. Infinite cache: r1
// hits 2, r3 hits 3: 5 / 11.
TEST(TraceShapeTest, MatchesAHandCountedTrace) {
  const std::vector<TraceRequest> trace = {
      Request({1, 2, 3}), Request({1, 2, 4}), Request({5}),
      Request({1, 2, 3, 6})};
  const TraceShape s = MeasureShape(BlockTrace::Build(trace));
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.references, 11);
  EXPECT_EQ(s.unique_blocks, 6);
  EXPECT_DOUBLE_EQ(s.unique_used_once, 0.5);
  EXPECT_DOUBLE_EQ(s.refs_to_used_once, 3.0 / 11);
  EXPECT_EQ(s.reuse_p25, 3);
  EXPECT_EQ(s.reuse_p50, 4);
  EXPECT_EQ(s.reuse_p75, 4);
  EXPECT_EQ(s.reuse_p90, 7);
  EXPECT_EQ(s.blocks_p50, 3);
  EXPECT_EQ(s.blocks_p90, 4);
  EXPECT_EQ(s.blocks_p99, 4);
  EXPECT_DOUBLE_EQ(s.infinite_hit_rate, 5.0 / 11);
}

TEST(TraceShapeTest, EmptyTraceIsAllZero) {
  const TraceShape s = MeasureShape(BlockTrace::Build({}));
  EXPECT_EQ(s.references, 0);
  EXPECT_EQ(s.unique_used_once, 0);
  EXPECT_EQ(s.reuse_p50, 0);
  EXPECT_EQ(s.infinite_hit_rate, 0);
  EXPECT_NE(ShapeJson(s).find("\"requests\": 0"), std::string::npos);
}

// The shipped traces have the shape issue 25's table gives for them (the
// same definitions, so a generated trace can be compared with the hidden
// real one's figures there).
TEST(TraceShapeTest, ShippedTracesHaveTheShapeOfTheTable) {
  const std::string dir =
      std::string(std::getenv("TEST_SRCDIR")) + "/hicache/bench/traces/";
  auto synthetic = ReadMooncakeTrace(dir + "mooncake_synthetic.jsonl");
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  TraceShape s = MeasureShape(BlockTrace::Build(*synthetic));
  EXPECT_NEAR(s.unique_used_once, 0.584, 0.0005);
  EXPECT_NEAR(s.refs_to_used_once, 0.211, 0.0005);
  EXPECT_EQ(s.reuse_p25, 2644);
  EXPECT_EQ(s.reuse_p50, 7979);
  EXPECT_EQ(s.reuse_p75, 18081);
  EXPECT_EQ(s.reuse_p90, 32661);
  EXPECT_EQ(s.blocks_p50, 23);
  EXPECT_EQ(s.blocks_p90, 76);
  EXPECT_EQ(s.blocks_p99, 130);
  EXPECT_NEAR(s.infinite_hit_rate, 0.6396, 0.00005);

  auto conversations = ReadMooncakeTrace(dir + "conversations.jsonl");
  ASSERT_TRUE(conversations.ok()) << conversations.status();
  s = MeasureShape(BlockTrace::Build(*conversations));
  EXPECT_NEAR(s.unique_used_once, 0.389, 0.0005);
  EXPECT_NEAR(s.refs_to_used_once, 0.075, 0.0005);
  EXPECT_EQ(s.reuse_p50, 383);
  EXPECT_EQ(s.blocks_p99, 42);
  EXPECT_NEAR(s.infinite_hit_rate, 0.8077, 0.00005);
}

}  // namespace
}  // namespace hicache
