#pragma once

#include <cstdint>
#include <vector>

namespace hicache {

// Approximate access frequency of 64-bit keys over a recent window (TinyLFU,
// Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
// Policy", 2017): a count-min sketch of 4-bit counters (depth 4) behind a
// doorkeeper Bloom filter, aged by halving every counter once `sample_size`
// increments have been recorded since the last aging.
//
// Layout. The sketch has 4 rows of `width` 4-bit counters, width = the next
// power of two >= expected_keys (at least 64); counters are packed 16 to a
// uint64_t. Each row indexes a key with its own re-mix of the key
// (splitmix64's finalizer with a per-row seed), so the caller's keys only need
// to be distinct, not well distributed. The doorkeeper is a Bloom filter of
// the next power of two >= 8 * expected_keys bits with 3 hash functions
// (about 3% false positives with expected_keys keys in it).
//
// Updates use the paper's "minimal increment" (conservative update): only
// the counters equal to the key's current minimum are incremented, which
// keeps every estimate an upper bound of the true count (up to saturation
// and aging) while lowering the over-estimation from collisions.
//
// Memory: 4 rows * width / 2 bytes of counters plus doorkeeper_bits / 8
// bytes, i.e. 2 + 1 = 3 bytes per expected key when expected_keys is a power
// of two, and up to 6 bytes per expected key just above one (both sizes round
// up to a power of two). The default (65536 keys) takes 192 KiB.
//
// Increment and Estimate are O(1) and never allocate. Not thread-safe: the
// caller serializes all calls (Estimate is const and may run concurrently
// with other Estimates only).
class FrequencySketch {
 public:
  struct Options {
    // Distinct keys expected in a window. Values below 64 (including <= 0)
    // clamp to 64; values above 2^30 clamp to 2^30.
    int64_t expected_keys = 1 << 16;
    // Increments per aging window; <= 0 means 10 * expected_keys (after the
    // clamp above).
    int64_t sample_size = 0;
  };

  // The largest value Estimate returns: a saturated counter plus the
  // doorkeeper bit.
  static constexpr int kMaxEstimate = 16;

  explicit FrequencySketch(const Options& options);

  // Records one access. The first access of a key in a window only sets its
  // doorkeeper bits; later ones increment the counters (saturating at 15).
  // Every call counts towards sample_size; the call that reaches it ages the
  // sketch (after recording the access).
  void Increment(uint64_t key);

  // Estimated accesses in the current window: the minimum over the key's
  // counters, plus 1 if the doorkeeper holds the key. 0 for a key never seen
  // (up to false positives). Never more than kMaxEstimate.
  int Estimate(uint64_t key) const;

  // Halves every counter (rounding down) and clears the doorkeeper; resets
  // increments(). Called automatically; public for tests. A key estimated at
  // k before (k - 1 counted, 1 in the doorkeeper) is estimated at
  // (k - 1) / 2 after.
  void Age();

  int64_t sample_size() const { return sample_size_; }
  // Increments since the last aging.
  int64_t increments() const { return increments_; }
  // Agings so far (automatic and explicit).
  int64_t agings() const { return agings_; }
  // Counters per row (a power of two >= 64).
  int64_t width() const { return width_; }
  // Bytes held by the counters and the doorkeeper.
  int64_t memory_bytes() const;

 private:
  static constexpr int kDepth = 4;
  static constexpr int kDoorkeeperHashes = 3;

  // Word index (in table_) and bit shift of `key`'s counter in `row`.
  void Locate(uint64_t key, int row, int64_t* word, int* shift) const;
  uint64_t DoorkeeperBit(uint64_t key, int i) const;
  bool DoorkeeperContains(uint64_t key) const;
  // Returns whether the key was already present.
  bool DoorkeeperPut(uint64_t key);
  int MinCounter(uint64_t key) const;

  int64_t width_;
  int64_t sample_size_;
  int64_t increments_ = 0;
  int64_t agings_ = 0;
  // kDepth rows of width_ / 16 words each, row after row.
  std::vector<uint64_t> table_;
  std::vector<uint64_t> doorkeeper_;
  uint64_t doorkeeper_mask_;  // doorkeeper bits - 1
};

}  // namespace hicache
