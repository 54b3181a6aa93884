#include "version/version.h"

#include <string>

// Defined by //version:stamped (a generated file) in the binaries that link
// it; a null address everywhere else.
extern "C" __attribute__((weak)) const char hicache_git_revision[];

namespace hicache {

std::string_view Version() { return "0.2.0"; }

std::string_view GitRevision() {
  if (&hicache_git_revision[0] == nullptr) return "unstamped";
  return hicache_git_revision;
}

std::string VersionString() {
  std::string text(Version());
  text += " (";
  text += GitRevision();
  text += ")";
  return text;
}

}  // namespace hicache
