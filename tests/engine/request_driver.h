#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "daemon/engine/hicache_engine.h"

namespace hicache::testing {

// A scheduler for stress tests: random requests over a few shared prefixes
// (small vocabulary, so prefixes collide), each one load-back, compute the
// rest (KvPattern bytes), back it up per layer or all at once, insert and
// attach -- or abort. Every hit's bytes are checked against the pattern of
// the tokens it claims to hold; misses are fine. A failed load (ABORTED) is
// a miss beyond the device part of its hit. Reports a gtest failure on wrong
// bytes or an unexpected status.
class RequestDriver {
 public:
  struct Counts {
    int64_t requests = 0;
    int64_t verified = 0;     // Requests with a hit, whose bytes were checked.
    int64_t hit_tokens = 0;   // Tokens of those hits.
    int64_t loads = 0;        // Load-backs that completed.
    int64_t failed_loads = 0; // Load-backs that reported ABORTED.
    int64_t backups = 0;      // Backups prepared (op id != 0).
    int64_t attach_refused = 0;  // AttachBackup errors (then rolled back).
  };

  // Page size 4 (the stress tests' geometry).
  static constexpr uint32_t kPageSize = 4;

  RequestDriver(HiCacheEngine* engine, uint64_t seed, std::string ns);

  // One request; use under ASSERT_NO_FATAL_FAILURE.
  void Request();

  const Counts& counts() const { return counts_; }
  int64_t hits() const { return counts_.hit_tokens; }
  int64_t loads() const { return counts_.loads; }

 private:
  HiCacheEngine* engine_;
  std::mt19937_64 rng_;
  std::string ns_;
  std::vector<std::vector<int32_t>> bases_;
  Counts counts_;
};

// What DriveConcurrently saw: threads that stopped at a fatal failure, and
// the drivers' counts summed.
struct ConcurrentDrive {
  int failed_threads = 0;
  RequestDriver::Counts total;
};

// `threads` scheduler threads on one engine at once, each a RequestDriver
// seeded `first_seed + t` running `requests` requests (stopping at its first
// fatal failure). The first two share the namespace "shared", the others
// have their own.
ConcurrentDrive DriveConcurrently(HiCacheEngine* engine, uint64_t first_seed,
                                  int requests, int threads = 4);

}  // namespace hicache::testing
