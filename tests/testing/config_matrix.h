#pragma once

// The configuration matrix of the randomized tests (issue 26): every write
// policy x every eviction policy x C in {1, 2, 4, 8} x L2 pressure on/off.
// Each run covers the daemon's default pair at every C (always), plus a
// sample of the rest drawn with a seed that is logged (rerun it with
// HICACHE_MATRIX_SEED=N); HICACHE_FULL_MATRIX=1 (`tools/dev test
// --full-matrix`) runs all of it.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/policies.h"

namespace hicache::testing {

struct EngineConfig {
  uint32_t cp = 1;
  WritePolicy write = DaemonConfig::kDefaultWritePolicy;
  EvictionPolicy eviction = DaemonConfig::kDefaultEvictionPolicy;
  bool l2_pressure = true;  // A host tier much smaller than the traffic.

  bool IsDaemonDefault() const {
    return write == DaemonConfig::kDefaultWritePolicy &&
           eviction == DaemonConfig::kDefaultEvictionPolicy;
  }
  // A test name: "C2_write_ahead_tinylfu_l2pressure".
  std::string Name() const {
    std::string name =
        absl::StrCat("C", cp, "_", PolicyName(write), "_", PolicyName(eviction),
                     l2_pressure ? "_l2pressure" : "_l2roomy");
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    }
    return name;
  }
};

inline constexpr WritePolicy kAllWritePolicies[] = {
    WritePolicy::kWriteThrough, WritePolicy::kWriteThroughSelective,
    WritePolicy::kWriteBack, WritePolicy::kWriteAhead};
inline constexpr EvictionPolicy kAllEvictionPolicies[] = {
    EvictionPolicy::kLru,      EvictionPolicy::kLfu,  EvictionPolicy::kFifo,
    EvictionPolicy::kPriority, EvictionPolicy::kSlru, EvictionPolicy::kTinyLfu};
inline constexpr uint32_t kAllCpSizes[] = {1, 2, 4, 8};

// The whole matrix.
inline std::vector<EngineConfig> FullConfigMatrix() {
  std::vector<EngineConfig> all;
  for (uint32_t cp : kAllCpSizes) {
    for (WritePolicy write : kAllWritePolicies) {
      for (EvictionPolicy eviction : kAllEvictionPolicies) {
        for (bool l2_pressure : {true, false}) {
          all.push_back({cp, write, eviction, l2_pressure});
        }
      }
    }
  }
  return all;
}

// What one run of `test` covers: the daemon's default pair under L2
// pressure at every C, then `sampled` other cells of the matrix (all of it
// with HICACHE_FULL_MATRIX=1). The sample's seed is printed to stderr.
inline std::vector<EngineConfig> ConfigMatrixForThisRun(const char* test,
                                                        int sampled) {
  std::vector<EngineConfig> all = FullConfigMatrix();
  const char* full = std::getenv("HICACHE_FULL_MATRIX");
  if (full != nullptr && std::string(full) == "1") {
    std::fprintf(stderr, "%s: the full configuration matrix (%zu cases)\n",
                 test, all.size());
    return all;
  }
  std::vector<EngineConfig> run;
  std::vector<EngineConfig> rest;
  for (const EngineConfig& c : all) {
    (c.IsDaemonDefault() && c.l2_pressure ? run : rest).push_back(c);
  }
  uint64_t seed = std::random_device{}();
  if (const char* fixed = std::getenv("HICACHE_MATRIX_SEED")) {
    if (!absl::SimpleAtoi(fixed, &seed)) {
      std::fprintf(stderr, "HICACHE_MATRIX_SEED=%s is not a number\n", fixed);
      std::abort();
    }
  }
  std::fprintf(stderr,
               "%s: the daemon's defaults at C = 1, 2, 4, 8 and %d sampled "
               "cases (HICACHE_MATRIX_SEED=%llu reruns this sample)\n",
               test, sampled, static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::shuffle(rest.begin(), rest.end(), rng);
  for (int i = 0; i < sampled && i < static_cast<int>(rest.size()); ++i) {
    run.push_back(rest[i]);
  }
  return run;
}

}  // namespace hicache::testing
