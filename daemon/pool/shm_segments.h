#pragma once

// POSIX shared-memory segments by name prefix (glibc keeps them in /dev/shm).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hicache {

// The shm names ("/name") of the segments whose names start with `prefix`
// (itself starting with '/'). An unreadable /dev/shm lists nothing.
std::vector<std::string> ListShmSegments(absl::string_view prefix);

// Unlinks every segment ListShmSegments(prefix) names; one already gone is
// fine. The first other failure, naming the segment.
absl::Status RemoveShmSegments(absl::string_view prefix);

}  // namespace hicache
