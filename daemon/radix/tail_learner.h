#pragma once

#include <array>
#include <cstdint>

namespace hicache {

// Learns how long the unshared end of a cached request usually is: when a
// later request shares a cached leaf's prefix and diverges inside it, the
// pages after the divergence are one observation. In chat-style traffic the
// last partial block of a prompt is replaced by the next turn (and a repeated
// prompt diverges there too), so those few pages are rarely reused while the
// rest of the leaf is; the tree evicts them first (RadixTree::EvictHost).
//
// Keeps a histogram of observations of 1..kMaxPages pages (longer ones count
// as "long"), halved every kWindow observations so it follows the traffic.
// Thread-compatible.
class TailLearner {
 public:
  static constexpr int64_t kMaxPages = 64;
  static constexpr int64_t kWindow = 4096;
  static constexpr int64_t kMinObservations = 32;

  // One divergence leaving `pages` pages of a leaf unshared (ignored if < 1).
  void Observe(int64_t pages);
  // The median observation, if at least kMinObservations were seen and the
  // median is at most kMaxPages pages; 0 (no tail) otherwise.
  int64_t TailPages() const;
  int64_t observations() const { return total_; }

 private:
  std::array<int64_t, kMaxPages + 2> counts_{};  // [1, kMaxPages]; last: long.
  int64_t total_ = 0;
};

}  // namespace hicache
