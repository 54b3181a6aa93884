#include "daemon/persist/state_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hicache::persist {

std::string JournalPath(const std::string& state_dir) {
  return state_dir + "/journal";
}

std::string JournalTmpPath(const std::string& state_dir) {
  return state_dir + "/journal.tmp";
}

absl::Status PrepareStateDir(const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("state directory: empty path");
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state directory ", dir, ": mkdir: ", std::strerror(errno)));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state directory ", dir, ": stat: ", std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory ", dir, " is not a directory"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory ", dir, " is owned by uid ", st.st_uid,
                     ", not by this daemon's uid ", ::geteuid()));
  }
  if ((st.st_mode & 077) != 0 && ::chmod(dir.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state directory ", dir, ": chmod 0700: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace hicache::persist
