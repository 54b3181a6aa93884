#include "tests/testing/temp_dir.h"

#include <stdlib.h>

#include <filesystem>
#include <system_error>

namespace hicache::testing {

TempDir::TempDir() {
  char pattern[] = "/tmp/hicache-test-XXXXXX";
  const char* dir = mkdtemp(pattern);
  if (dir == nullptr) abort();
  path_ = dir;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::Child(const std::string& name) const {
  return path_ + "/" + name;
}

}  // namespace hicache::testing
