#pragma once

#include <array>
#include <cstdint>

namespace hicache {

// Durations (a background queue's lag, say) counted in buckets a quarter
// octave wide: each about 19% wider than the one before, from 1 us to about
// 19 hours; anything shorter counts in the first, longer in the last. A
// quantile reads as the upper edge of the bucket that holds it, so it is at
// most 19% high. Fixed size, no allocation; not thread-safe (its owner
// guards it), and cheap to copy into a stats snapshot.
class LagHistogram {
 public:
  void Add(int64_t ns);
  void Merge(const LagHistogram& other);
  int64_t count() const { return count_; }
  int64_t max_ns() const { return max_ns_; }
  // The q-quantile (0 < q <= 1) in nanoseconds; 0 when empty.
  int64_t QuantileNs(double q) const;

 private:
  static constexpr int kBuckets = 4 * 36 + 1;
  static int BucketOf(int64_t ns);
  static int64_t UpperEdgeNs(int bucket);

  std::array<int64_t, kBuckets> counts_{};
  int64_t count_ = 0;
  int64_t max_ns_ = 0;
};

}  // namespace hicache
