#include "tools/gpu_runner/gtest_results.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace hicache::gpu_runner {

std::string GtestResults::Status() const {
  if (failed > 0) return "fail";
  if (passed > 0) return "pass";
  return "skip";
}

absl::StatusOr<GtestResults> ParseGtestJson(const std::string& text) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("testsuites") ||
      !doc["testsuites"].is_array()) {
    return absl::InvalidArgumentError("not a GoogleTest JSON report");
  }
  GtestResults results;
  for (const nlohmann::json& suite : doc["testsuites"]) {
    if (!suite.is_object() || !suite.contains("testsuite")) continue;
    const std::string suite_name = suite.value("name", "");
    for (const nlohmann::json& c : suite["testsuite"]) {
      if (!c.is_object()) continue;
      const std::string name = absl::StrCat(suite_name, ".", c.value("name", ""));
      const bool failed = c.contains("failures") && c["failures"].is_array() &&
                          !c["failures"].empty();
      const std::string result = c.value("result", "");
      const std::string status = c.value("status", "");
      if (failed) {
        ++results.failed;
        if (results.failures.size() < 20) results.failures.push_back(name);
      } else if (result == "SKIPPED" || result == "SUPPRESSED" ||
                 status == "NOTRUN") {
        ++results.skipped;
        if (c.contains("skipped") && c["skipped"].is_object()) {
          std::string why = c["skipped"].value("message", "");
          // GoogleTest prefixes the file and line; keep the message.
          if (const size_t at = why.find("\n"); at != std::string::npos) {
            why = why.substr(at + 1);
          }
          if (results.skip_reasons.size() < 5 &&
              std::find(results.skip_reasons.begin(),
                        results.skip_reasons.end(),
                        why) == results.skip_reasons.end()) {
            results.skip_reasons.push_back(why);
          }
        }
      } else {
        ++results.passed;
      }
    }
  }
  return results;
}

}  // namespace hicache::gpu_runner
