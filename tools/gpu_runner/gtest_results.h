#pragma once

// What one GoogleTest binary's --gtest_output=json file says: how many cases
// passed, failed and were skipped, and the status of the binary as the GPU
// check reports it.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hicache::gpu_runner {

struct GtestResults {
  int passed = 0;
  int failed = 0;
  int skipped = 0;  // GTEST_SKIP, and cases not run.
  std::vector<std::string> failures;  // "Suite.Case", the first 20.
  std::vector<std::string> skip_reasons;  // Distinct messages, the first 5.

  // "fail" if any case failed, else "pass" if any passed, else "skip".
  std::string Status() const;
};

// Parses the JSON GoogleTest writes. INVALID_ARGUMENT when it is not such a
// document (a binary killed mid-run leaves none or a partial one).
absl::StatusOr<GtestResults> ParseGtestJson(const std::string& text);

}  // namespace hicache::gpu_runner
