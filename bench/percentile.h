#pragma once

// The nearest-rank percentile every benchmark here reports.

#include <algorithm>
#include <vector>

namespace hicache {

// The q-quantile (0 <= q <= 1) of `samples`: the sorted sample at index
// floor(q * n), clamped to the last; 0 for no samples.
inline double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  return samples[std::min(samples.size() - 1,
                          static_cast<size_t>(q * samples.size()))];
}

}  // namespace hicache
