#include "daemon/core/build_info.h"

#include "absl/strings/str_cat.h"
#include "version/version.h"

namespace hicache {
namespace {

std::string CompilerString() {
#if defined(__clang__)
  return absl::StrCat("clang ", __clang_major__, ".", __clang_minor__, ".",
                      __clang_patchlevel__);
#elif defined(__GNUC__)
  return absl::StrCat("gcc ", __GNUC__, ".", __GNUC_MINOR__, ".",
                      __GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

std::string BuildModeString() {
#ifdef NDEBUG
  std::string mode = "opt";
#else
  std::string mode = "debug";
#endif
#ifdef HICACHE_ASAN
  absl::StrAppend(&mode, "+asan");
#endif
#ifdef HICACHE_TSAN
  absl::StrAppend(&mode, "+tsan");
#endif
#ifdef HICACHE_UBSAN
  absl::StrAppend(&mode, "+ubsan");
#endif
  return mode;
}

}  // namespace

const BuildInfo& GetBuildInfo() {
  static const BuildInfo* const kInfo = new BuildInfo{
      .version = std::string(Version()),
      .git_revision = std::string(GitRevision()),
      .compiler = CompilerString(),
      .build_mode = BuildModeString(),
#ifdef HICACHE_HAVE_CUDA
      .cuda_support = true,
#else
      .cuda_support = false,
#endif
  };
  return *kInfo;
}

}  // namespace hicache
