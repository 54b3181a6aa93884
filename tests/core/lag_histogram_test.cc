// LagHistogram: quantiles within a bucket's width (at most 19% high, never
// above the largest value seen), merge, and the edges.
#include "daemon/core/lag_histogram.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(LagHistogramTest, EmptyReadsZero) {
  LagHistogram h;
  EXPECT_EQ(h.count(), 0);
  EXPECT_EQ(h.QuantileNs(0.5), 0);
  EXPECT_EQ(h.QuantileNs(0.99), 0);
}

TEST(LagHistogramTest, QuantilesAreAtMostABucketHigh) {
  LagHistogram h;
  // 1..1000 ms, one each: p50 is 500 ms, p99 990 ms.
  for (int64_t ms = 1; ms <= 1000; ++ms) h.Add(ms * 1'000'000);
  EXPECT_EQ(h.count(), 1000);
  EXPECT_EQ(h.max_ns(), 1'000'000'000);
  const int64_t p50 = h.QuantileNs(0.5);
  EXPECT_GE(p50, 500'000'000);
  EXPECT_LE(p50, 500'000'000 * 1.19);
  const int64_t p99 = h.QuantileNs(0.99);
  EXPECT_GE(p99, 990'000'000);
  EXPECT_LE(p99, 1'000'000'000);  // Never above the largest value.
  EXPECT_EQ(h.QuantileNs(1.0), 1'000'000'000);
}

TEST(LagHistogramTest, MergeAddsCountsAndKeepsTheMax) {
  LagHistogram a, b;
  for (int i = 0; i < 99; ++i) a.Add(1'000);    // 1 us.
  b.Add(20'000'000'000);                       // 20 s.
  a.Merge(b);
  EXPECT_EQ(a.count(), 100);
  EXPECT_EQ(a.max_ns(), 20'000'000'000);
  EXPECT_LE(a.QuantileNs(0.99), 1'190);
  EXPECT_EQ(a.QuantileNs(1.0), 20'000'000'000);
}

TEST(LagHistogramTest, EdgesClamp) {
  LagHistogram h;
  h.Add(-5);  // A clock step: counted as 0.
  h.Add(0);
  h.Add(int64_t{1} << 62);  // Past the last bucket.
  EXPECT_EQ(h.count(), 3);
  EXPECT_LE(h.QuantileNs(0.5), 1'000);  // The first bucket: under 1 us.
  EXPECT_EQ(h.QuantileNs(1.0), int64_t{1} << 62);
}

}  // namespace
}  // namespace hicache
