#include "daemon/radix/frequency_sketch.h"

#include <algorithm>
#include <bit>

namespace hicache {

namespace {

constexpr int64_t kMinKeys = 64;
constexpr int64_t kMaxKeys = int64_t{1} << 30;
constexpr int kCountersPerWord = 16;
constexpr uint64_t kCounterMax = 15;
// Each 4-bit counter with its top bit cleared: the mask for halving a word.
constexpr uint64_t kHalveMask = 0x7777777777777777ULL;

// Per-row and per-doorkeeper-hash seeds (arbitrary odd constants, fixed so
// the sketch is deterministic).
constexpr uint64_t kRowSeeds[4] = {0x9e3779b97f4a7c15ULL, 0xc2b2ae3d27d4eb4fULL,
                                   0x165667b19e3779f9ULL,
                                   0xd6e8feb86659fd93ULL};
constexpr uint64_t kDoorkeeperSeeds[3] = {
    0xa0761d6478bd642fULL, 0xe7037ed1a0b428dbULL, 0x8ebc6af09c88c6e3ULL};

// splitmix64's finalizer applied to key ^ seed (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", 2014).
uint64_t Mix(uint64_t key, uint64_t seed) {
  uint64_t z = key ^ seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

FrequencySketch::FrequencySketch(const Options& options) {
  const int64_t keys =
      std::clamp<int64_t>(options.expected_keys, kMinKeys, kMaxKeys);
  width_ = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(keys)));
  sample_size_ = options.sample_size > 0 ? options.sample_size : 10 * keys;
  table_.assign(kDepth * width_ / kCountersPerWord, 0);
  const uint64_t doorkeeper_bits =
      std::bit_ceil(static_cast<uint64_t>(keys) * 8);
  doorkeeper_.assign(doorkeeper_bits / 64, 0);
  doorkeeper_mask_ = doorkeeper_bits - 1;
}

int64_t FrequencySketch::memory_bytes() const {
  return static_cast<int64_t>((table_.size() + doorkeeper_.size()) *
                              sizeof(uint64_t));
}

void FrequencySketch::Locate(uint64_t key, int row, int64_t* word,
                             int* shift) const {
  const uint64_t index =
      Mix(key, kRowSeeds[row]) & static_cast<uint64_t>(width_ - 1);
  *word = row * (width_ / kCountersPerWord) +
          static_cast<int64_t>(index / kCountersPerWord);
  *shift = static_cast<int>(index % kCountersPerWord) * 4;
}

uint64_t FrequencySketch::DoorkeeperBit(uint64_t key, int i) const {
  return Mix(key, kDoorkeeperSeeds[i]) & doorkeeper_mask_;
}

bool FrequencySketch::DoorkeeperContains(uint64_t key) const {
  for (int i = 0; i < kDoorkeeperHashes; ++i) {
    const uint64_t bit = DoorkeeperBit(key, i);
    if ((doorkeeper_[bit / 64] & (uint64_t{1} << (bit % 64))) == 0) {
      return false;
    }
  }
  return true;
}

bool FrequencySketch::DoorkeeperPut(uint64_t key) {
  bool present = true;
  for (int i = 0; i < kDoorkeeperHashes; ++i) {
    const uint64_t bit = DoorkeeperBit(key, i);
    uint64_t& word = doorkeeper_[bit / 64];
    const uint64_t mask = uint64_t{1} << (bit % 64);
    if ((word & mask) == 0) {
      present = false;
      word |= mask;
    }
  }
  return present;
}

int FrequencySketch::MinCounter(uint64_t key) const {
  uint64_t min = kCounterMax;
  for (int row = 0; row < kDepth; ++row) {
    int64_t word;
    int shift;
    Locate(key, row, &word, &shift);
    min = std::min(min, (table_[word] >> shift) & kCounterMax);
  }
  return static_cast<int>(min);
}

void FrequencySketch::Increment(uint64_t key) {
  if (DoorkeeperPut(key)) {
    // Seen before in this window: minimal increment of the counters.
    int64_t words[kDepth];
    int shifts[kDepth];
    uint64_t min = kCounterMax;
    for (int row = 0; row < kDepth; ++row) {
      Locate(key, row, &words[row], &shifts[row]);
      min = std::min(min, (table_[words[row]] >> shifts[row]) & kCounterMax);
    }
    if (min < kCounterMax) {
      for (int row = 0; row < kDepth; ++row) {
        if (((table_[words[row]] >> shifts[row]) & kCounterMax) == min) {
          table_[words[row]] += uint64_t{1} << shifts[row];
        }
      }
    }
  }
  if (++increments_ >= sample_size_) Age();
}

int FrequencySketch::Estimate(uint64_t key) const {
  return MinCounter(key) + (DoorkeeperContains(key) ? 1 : 0);
}

void FrequencySketch::Age() {
  for (uint64_t& word : table_) word = (word >> 1) & kHalveMask;
  std::fill(doorkeeper_.begin(), doorkeeper_.end(), 0);
  increments_ = 0;
  ++agings_;
}

}  // namespace hicache
