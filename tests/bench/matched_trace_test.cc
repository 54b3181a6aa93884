// The matched workload (bench/matched_trace.h) has, with its default
// options, the shape of the Mooncake conversation trace that the hit-rate
// goals are set on (issue 25's table): every statistic within 10%.
#include "bench/matched_trace.h"

#include <cmath>
#include <map>
#include <string>

#include "bench/cache_bound.h"
#include "bench/trace_shape.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

void ExpectWithin10Percent(double got, double want, const std::string& what) {
  EXPECT_LE(std::abs(got - want) / want, 0.10)
      << what << ": " << got << " against " << want;
}

TEST(MatchedTraceTest, DefaultsHaveTheShapeOfTheConversationTrace) {
  auto trace = GenerateMatchedTrace({});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 12031u);
  const TraceShape s = MeasureShape(BlockTrace::Build(*trace));
  ExpectWithin10Percent(s.unique_used_once, 0.758, "unique blocks used once");
  ExpectWithin10Percent(s.refs_to_used_once, 0.481,
                        "references to blocks used once");
  ExpectWithin10Percent(s.reuse_p25, 4545, "reuse distance p25");
  ExpectWithin10Percent(s.reuse_p50, 9275, "reuse distance p50");
  ExpectWithin10Percent(s.reuse_p75, 21803, "reuse distance p75");
  ExpectWithin10Percent(s.reuse_p90, 41730, "reuse distance p90");
  ExpectWithin10Percent(s.blocks_p50, 14, "blocks per request p50");
  ExpectWithin10Percent(s.blocks_p90, 54, "blocks per request p90");
  ExpectWithin10Percent(s.blocks_p99, 167, "blocks per request p99");
  ExpectWithin10Percent(s.infinite_hit_rate, 0.3664, "infinite-cache hit rate");
}

TEST(MatchedTraceTest, ASeedGivesTheSameTraceAndIdsArePrefixChained) {
  MatchedTraceOptions options;
  options.requests = 500;
  auto a = GenerateMatchedTrace(options);
  auto b = GenerateMatchedTrace(options);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].hash_ids, (*b)[i].hash_ids);
    EXPECT_EQ((*a)[i].input_length,
              static_cast<int64_t>((*a)[i].hash_ids.size()) * 512);
  }
  // Equal ids have equal prefixes: each id has one parent.
  std::map<int64_t, int64_t> parent;
  for (const TraceRequest& r : *a) {
    for (size_t k = 0; k < r.hash_ids.size(); ++k) {
      const int64_t p = k == 0 ? -1 : r.hash_ids[k - 1];
      auto [it, inserted] = parent.emplace(r.hash_ids[k], p);
      EXPECT_EQ(it->second, p) << "id " << r.hash_ids[k];
    }
  }
}

TEST(MatchedTraceTest, BadOptionsAreRejected) {
  MatchedTraceOptions o;
  o.slots = 0;
  EXPECT_EQ(GenerateMatchedTrace(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.mean_turns = 1.5;
  EXPECT_FALSE(GenerateMatchedTrace(o).ok());
  o = {};
  o.one_shot_p = 1.5;
  EXPECT_FALSE(GenerateMatchedTrace(o).ok());
  o = {};
  o.system_max_blocks = 0;
  EXPECT_FALSE(GenerateMatchedTrace(o).ok());
}

}  // namespace
}  // namespace hicache
