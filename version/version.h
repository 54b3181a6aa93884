#pragma once

// The identity of a hicache release build, shared by the daemon and the
// clients (this package depends on nothing, so client/ may use it).
//
// The git revision is stamped at link time, and only into the binaries that
// report it (hicached, hicachectl): they depend on //version:stamped, a
// library generated from Bazel's workspace status
// (tools/workspace_status.sh). Everything else — libraries and tests — reads
// "unstamped", so that a new commit relinks two binaries instead of every
// test.

#include <string>
#include <string_view>

namespace hicache {

// The release version, e.g. "0.2.0". Written here first; the Python
// client's hicache/_version.py repeats it (//tests/packaging:version_test).
std::string_view Version();

// The git revision the binary was built from: a 12-digit abbreviated hash,
// with "-dirty" when the working tree had uncommitted changes; "unknown" when
// the build was not in a git checkout; "unstamped" in a binary that does not
// link //version:stamped.
std::string_view GitRevision();

// "<version> (<revision>)", e.g. "0.2.0 (1ac4859e1f2a)".
std::string VersionString();

}  // namespace hicache
