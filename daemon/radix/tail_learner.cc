#include "daemon/radix/tail_learner.h"

#include <algorithm>

namespace hicache {

void TailLearner::Observe(int64_t pages) {
  if (pages < 1) return;
  ++counts_[std::min(pages, kMaxPages + 1)];
  if (++total_ >= kWindow) {
    total_ = 0;
    for (int64_t& c : counts_) {
      c /= 2;
      total_ += c;
    }
  }
}

int64_t TailLearner::TailPages() const {
  if (total_ < kMinObservations) return 0;
  int64_t seen = 0;
  for (int64_t pages = 1; pages <= kMaxPages; ++pages) {
    seen += counts_[pages];
    if (2 * seen >= total_) return pages;
  }
  return 0;  // The median is a long remainder: no short tail to learn.
}

}  // namespace hicache
