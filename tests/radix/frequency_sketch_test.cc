#include "daemon/radix/frequency_sketch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using Options = FrequencySketch::Options;

// Keys as a caller would pass them (distinct; deliberately not hashed, so the
// sketch's own re-mixing is what spreads them).
uint64_t Key(int i) { return static_cast<uint64_t>(i); }

// A sketch that never ages on its own within a test.
FrequencySketch Unaged(int64_t expected_keys) {
  return FrequencySketch(
      Options{.expected_keys = expected_keys, .sample_size = int64_t{1} << 40});
}

TEST(FrequencySketchTest, NeverSeenKeysEstimateZero) {
  FrequencySketch sketch = Unaged(1 << 16);
  for (int i = 0; i < 100; ++i) {
    for (int j = 0; j <= i % 5; ++j) sketch.Increment(Key(i));
  }
  int nonzero = 0;
  for (int i = 100; i < 100100; ++i) nonzero += sketch.Estimate(Key(i)) != 0;
  EXPECT_EQ(nonzero, 0);
  EXPECT_EQ(sketch.Estimate(~uint64_t{0}), 0);
}

TEST(FrequencySketchTest, FewKeysInALargeTableAreExact) {
  FrequencySketch sketch = Unaged(1 << 16);
  int64_t increments = 0;
  for (int i = 0; i < 300; ++i) {
    for (int j = 0; j < i % 16; ++j, ++increments) sketch.Increment(Key(i));
  }
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(sketch.Estimate(Key(i)), i % 16) << "key " << i;
  }
  EXPECT_EQ(sketch.increments(), increments);
  EXPECT_EQ(sketch.agings(), 0);
}

TEST(FrequencySketchTest, NeverUnderestimatesWithinAWindow) {
  // 4x more keys than expected: collisions galore, but count-min with
  // minimal increment never counts below the truth.
  FrequencySketch sketch = Unaged(1024);
  absl::flat_hash_map<uint64_t, int> exact;
  std::mt19937_64 rng(7);
  for (int n = 0; n < 40000; ++n) {
    const uint64_t key = Key(static_cast<int>(rng() % 4096));
    sketch.Increment(key);
    ++exact[key];
  }
  for (const auto& [key, count] : exact) {
    ASSERT_GE(sketch.Estimate(key), std::min(count, 16)) << "key " << key;
    ASSERT_LE(sketch.Estimate(key), FrequencySketch::kMaxEstimate);
  }
}

TEST(FrequencySketchTest, SaturatesAtFifteenPlusDoorkeeper) {
  FrequencySketch sketch = Unaged(64);
  for (int j = 1; j <= 100; ++j) {
    sketch.Increment(Key(5));
    EXPECT_EQ(sketch.Estimate(Key(5)), std::min(j, 16)) << j;
  }
  EXPECT_EQ(sketch.Estimate(Key(5)), FrequencySketch::kMaxEstimate);
  // A saturated counter does not bleed into its neighbours.
  int nonzero = 0;
  for (int i = 1000; i < 1100; ++i) nonzero += sketch.Estimate(Key(i)) != 0;
  EXPECT_LE(nonzero, 5);
}

TEST(FrequencySketchTest, AgeHalvesCountersAndClearsDoorkeeper) {
  FrequencySketch sketch = Unaged(1 << 16);
  for (int k = 0; k <= 20; ++k) {
    for (int j = 0; j < k; ++j) sketch.Increment(Key(k));
  }
  sketch.Age();
  EXPECT_EQ(sketch.agings(), 1);
  EXPECT_EQ(sketch.increments(), 0);
  for (int k = 0; k <= 20; ++k) {
    // k accesses: counters min(k - 1, 15), doorkeeper 1 (for k >= 1).
    const int counters = std::clamp(k - 1, 0, 15);
    EXPECT_EQ(sketch.Estimate(Key(k)), counters / 2) << "k = " << k;
  }
  // The doorkeeper is empty: the next access of a known key only sets its
  // doorkeeper bits again, the one after that increments its counters.
  sketch.Increment(Key(9));
  EXPECT_EQ(sketch.Estimate(Key(9)), 4 + 1);
  sketch.Increment(Key(9));
  EXPECT_EQ(sketch.Estimate(Key(9)), 5 + 1);
  // Aging twice more halves again (floor), down to 0.
  sketch.Age();
  EXPECT_EQ(sketch.Estimate(Key(9)), 2);
  EXPECT_EQ(sketch.Estimate(Key(20)), 3);
  sketch.Age();
  sketch.Age();
  sketch.Age();
  EXPECT_EQ(sketch.Estimate(Key(20)), 0);
  EXPECT_EQ(sketch.agings(), 5);
}

TEST(FrequencySketchTest, AgesAutomaticallyAfterSampleSizeIncrements) {
  FrequencySketch sketch(Options{.expected_keys = 64, .sample_size = 10});
  EXPECT_EQ(sketch.sample_size(), 10);
  for (int j = 0; j < 9; ++j) sketch.Increment(Key(1));
  EXPECT_EQ(sketch.Estimate(Key(1)), 9);
  EXPECT_EQ(sketch.increments(), 9);
  EXPECT_EQ(sketch.agings(), 0);
  // The 10th access is recorded (counter 9), then everything is halved.
  sketch.Increment(Key(1));
  EXPECT_EQ(sketch.agings(), 1);
  EXPECT_EQ(sketch.increments(), 0);
  EXPECT_EQ(sketch.Estimate(Key(1)), 4);
  // Doorkeeper-only accesses count towards the sample too.
  for (int i = 100; i < 130; ++i) sketch.Increment(Key(i));
  EXPECT_EQ(sketch.agings(), 4);
  EXPECT_EQ(sketch.increments(), 0);
  EXPECT_EQ(sketch.Estimate(Key(1)), 0);
}

// Draws key ranks 0..n-1 with P(rank r) proportional to 1 / (r + 1)^s.
class Zipf {
 public:
  Zipf(int n, double s) : cdf_(n) {
    double sum = 0;
    for (int r = 0; r < n; ++r) cdf_[r] = sum += 1.0 / std::pow(r + 1, s);
    for (double& c : cdf_) c /= sum;
  }
  int operator()(std::mt19937_64& rng) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto it = std::lower_bound(cdf_.begin(), cdf_.end(), u);
    return std::min<int>(it - cdf_.begin(), cdf_.size() - 1);
  }

 private:
  std::vector<double> cdf_;
};

TEST(FrequencySketchTest, OverestimationIsSmallOnAZipfWorkload) {
  constexpr int kUniverse = 20000;
  constexpr int kAccesses = 50000;
  std::mt19937_64 rng(42);
  Zipf zipf(kUniverse, 0.9);
  std::vector<uint64_t> trace;
  absl::flat_hash_map<uint64_t, int> exact;
  for (int n = 0; n < kAccesses; ++n) {
    // Scatter the ranks over the key space, as hashes would be.
    const uint64_t key = uint64_t{0x9e3779b97f4a7c15} * (zipf(rng) + 1);
    trace.push_back(key);
    ++exact[key];
  }
  // Size the sketch for the distinct keys the window really holds.
  FrequencySketch sketch = Unaged(static_cast<int64_t>(exact.size()));
  for (uint64_t key : trace) sketch.Increment(key);

  int64_t total_error = 0;
  int wrong = 0;
  for (const auto& [key, count] : exact) {
    const int error = sketch.Estimate(key) - std::min(count, 16);
    ASSERT_GE(error, 0) << "key " << key;
    total_error += error;
    wrong += error != 0;
  }
  const double mean_error = static_cast<double>(total_error) / exact.size();
  const double wrong_fraction = static_cast<double>(wrong) / exact.size();
  RecordProperty("distinct_keys", static_cast<int>(exact.size()));
  RecordProperty("mean_error_x1000", static_cast<int>(mean_error * 1000));
  RecordProperty("wrong_x1000", static_cast<int>(wrong_fraction * 1000));
  // Measured: 0.008 mean error, 0.8% of the keys over-estimated.
  EXPECT_LT(mean_error, 0.05);
  EXPECT_LT(wrong_fraction, 0.05);

  // Keys never accessed mostly estimate 0.
  int unseen_nonzero = 0;
  for (int i = 0; i < 10000; ++i) {
    unseen_nonzero += sketch.Estimate(Key(i) << 1 | 1) != 0;
  }
  RecordProperty("unseen_nonzero", unseen_nonzero);
  EXPECT_LT(unseen_nonzero, 500);
}

TEST(FrequencySketchTest, HeavyHittersRankAboveOneOffKeys) {
  constexpr int kHeavy = 50;
  constexpr int kOneOff = 4000;
  FrequencySketch sketch = Unaged(kHeavy + kOneOff);
  std::vector<uint64_t> trace;
  for (int i = 0; i < kHeavy; ++i) {
    for (int j = 0; j < 8; ++j) trace.push_back(Key(i));
  }
  for (int i = 0; i < kOneOff; ++i) trace.push_back(Key(1000000 + i));
  std::shuffle(trace.begin(), trace.end(), std::mt19937_64(3));
  for (uint64_t key : trace) sketch.Increment(key);

  int min_heavy = FrequencySketch::kMaxEstimate;
  for (int i = 0; i < kHeavy; ++i) {
    min_heavy = std::min(min_heavy, sketch.Estimate(Key(i)));
  }
  int max_one_off = 0;
  for (int i = 0; i < kOneOff; ++i) {
    max_one_off = std::max(max_one_off, sketch.Estimate(Key(1000000 + i)));
  }
  EXPECT_GE(min_heavy, 8);
  EXPECT_LT(max_one_off, min_heavy);
}

TEST(FrequencySketchTest, IsDeterministic) {
  FrequencySketch a(Options{.expected_keys = 512, .sample_size = 3000});
  FrequencySketch b(Options{.expected_keys = 512, .sample_size = 3000});
  std::mt19937_64 rng(11);
  Zipf zipf(2000, 1.0);
  for (int n = 0; n < 10000; ++n) {
    const uint64_t key = Key(zipf(rng));
    a.Increment(key);
    b.Increment(key);
  }
  EXPECT_EQ(a.agings(), 3);
  EXPECT_EQ(a.agings(), b.agings());
  EXPECT_EQ(a.increments(), b.increments());
  for (int i = 0; i < 3000; ++i) {
    ASSERT_EQ(a.Estimate(Key(i)), b.Estimate(Key(i))) << "key " << i;
  }
}

TEST(FrequencySketchTest, OptionsAreValidated) {
  const FrequencySketch minimum(Options{.expected_keys = 64});
  EXPECT_EQ(minimum.width(), 64);
  EXPECT_EQ(minimum.sample_size(), 640);
  // Counters: 4 rows * 64 / 2 bytes; doorkeeper: 512 bits.
  EXPECT_EQ(minimum.memory_bytes(), 4 * 64 / 2 + 512 / 8);
  for (int64_t keys : {int64_t{-5}, int64_t{0}, int64_t{1}, int64_t{63}}) {
    const FrequencySketch sketch(Options{.expected_keys = keys});
    EXPECT_EQ(sketch.width(), 64) << keys;
    EXPECT_EQ(sketch.sample_size(), 640) << keys;
    EXPECT_EQ(sketch.memory_bytes(), minimum.memory_bytes()) << keys;
  }
  const FrequencySketch fallback(
      Options{.expected_keys = 0, .sample_size = -3});
  EXPECT_EQ(fallback.sample_size(), 640);

  const FrequencySketch defaults(Options{});
  EXPECT_EQ(defaults.width(), 1 << 16);
  EXPECT_EQ(defaults.sample_size(), 10 << 16);
  EXPECT_EQ(defaults.memory_bytes(), 3 << 16);  // 3 bytes per expected key

  const FrequencySketch rounded(
      Options{.expected_keys = 1000, .sample_size = 7});
  EXPECT_EQ(rounded.width(), 1024);
  EXPECT_EQ(rounded.sample_size(), 7);
  EXPECT_EQ(rounded.memory_bytes(), 3 * 1024);
}

}  // namespace
}  // namespace hicache
