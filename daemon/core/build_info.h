#pragma once

#include <string>

namespace hicache {

// Identity of this build, fixed at compile time.
struct BuildInfo {
  std::string version;       // Semantic version, e.g. "0.2.0".
  std::string git_revision;  // version/version.h GitRevision().
  std::string compiler;    // e.g. "gcc 12.2.0" or "clang 14.0.6".
  std::string build_mode;  // "opt" or "debug", plus "+asan"/"+tsan"/"+ubsan".
  bool cuda_support;       // The CUDA backend was compiled in.
};

// Returns the build identity. Thread-safe; the object lives forever.
const BuildInfo& GetBuildInfo();

}  // namespace hicache
