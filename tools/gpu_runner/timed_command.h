#pragma once

// TimedCommand: runs one program in its own process group with a time box,
// its stdout and stderr appended to a log file, and reports how it ended.
// The GPU bundle's runner runs every phase through it, so that a phase that
// hangs is stopped (SIGTERM to its whole group, SIGKILL after a grace period)
// and the next phase still runs.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hicache::gpu_runner {

struct CommandResult {
  // The exit status, 128 + signal when it was killed by one, 124 when the
  // time box stopped it (as timeout(1)).
  int rc = 0;
  bool timed_out = false;
  absl::Duration elapsed;
};

struct CommandSpec {
  std::vector<std::string> argv;  // argv[0] is a path; PATH is not searched.
  std::vector<std::string> env;   // The whole environment ("K=V").
  std::string log_path;           // Appended to; created if missing.
  absl::Duration limit = absl::Minutes(1);
  // After the limit: SIGTERM to the group, then SIGKILL this much later.
  absl::Duration grace = absl::Seconds(10);
};

// Runs `spec` to completion or to its time box. Errors only when the log
// cannot be opened or the process cannot be spawned (then nothing ran).
absl::StatusOr<CommandResult> RunTimed(const CommandSpec& spec);

// The first executable `name` in the colon-separated `path`; empty if none.
std::string FindInPath(const std::string& name, const std::string& path);

}  // namespace hicache::gpu_runner
