#pragma once

#include <string>

#include "absl/status/status.h"

namespace hicache::persist {

// The journal's file names inside the state directory.
std::string JournalPath(const std::string& state_dir);     // <dir>/journal
std::string JournalTmpPath(const std::string& state_dir);  // <dir>/journal.tmp

// Makes `dir` usable as the state directory: creates it with mode 0700 when
// absent (its parent must exist), else requires a directory (symlinks to one
// are followed) owned by this euid and removes any group/other permission
// bits (chmod 0700). FAILED_PRECONDITION naming the problem otherwise. No
// lock file: the daemon's instance lock already excludes a second owner.
absl::Status PrepareStateDir(const std::string& dir);

}  // namespace hicache::persist
