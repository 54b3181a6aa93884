#pragma once

#include <string>

namespace hicache::testing {

// A fresh directory under /tmp (short enough for unix socket paths, which
// TEST_TMPDIR often is not), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string Child(const std::string& name) const;

 private:
  std::string path_;
};

}  // namespace hicache::testing
