#include "daemon/core/lag_histogram.h"

#include <algorithm>
#include <cmath>

namespace hicache {

int LagHistogram::BucketOf(int64_t ns) {
  if (ns < 1000) return 0;  // Under 1 us.
  const double quarter_octaves = 4 * std::log2(static_cast<double>(ns) / 1e3);
  return std::min(kBuckets - 1, 1 + static_cast<int>(quarter_octaves));
}

int64_t LagHistogram::UpperEdgeNs(int bucket) {
  return static_cast<int64_t>(1e3 * std::exp2(bucket / 4.0));
}

void LagHistogram::Add(int64_t ns) {
  ns = std::max<int64_t>(ns, 0);
  ++counts_[BucketOf(ns)];
  ++count_;
  max_ns_ = std::max(max_ns_, ns);
}

void LagHistogram::Merge(const LagHistogram& other) {
  for (int b = 0; b < kBuckets; ++b) counts_[b] += other.counts_[b];
  count_ += other.count_;
  max_ns_ = std::max(max_ns_, other.max_ns_);
}

int64_t LagHistogram::QuantileNs(double q) const {
  if (count_ == 0) return 0;
  const auto rank = static_cast<int64_t>(
      std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(count_)));
  int64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += counts_[b];
    if (seen >= std::max<int64_t>(rank, 1)) {
      // The last bucket is open-ended: its values reach the max.
      return b == kBuckets - 1 ? max_ns_ : std::min(UpperEdgeNs(b), max_ns_);
    }
  }
  return max_ns_;
}

}  // namespace hicache
