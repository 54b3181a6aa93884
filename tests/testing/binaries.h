#pragma once

#include <string>

#include "tests/testing/subprocess.h"

namespace hicache::testing {

// The real binaries in a test's runfiles (list them in the test's `data`).
inline const std::string& DaemonPath() {
  static const std::string path = RunfilePath("daemon/hicached");
  return path;
}
inline const std::string& CtlPath() {
  static const std::string path = RunfilePath("client/hicachectl");
  return path;
}

}  // namespace hicache::testing
