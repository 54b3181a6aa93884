#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hicache::testing {

// Path of a binary in this test's runfiles, e.g.
// RunfilePath("daemon/hicached").
std::string RunfilePath(const std::string& workspace_relative);

// A child process whose stdout and stderr go to files, read back on demand.
// The destructor SIGKILLs and reaps it if it is still running.
class Subprocess {
 public:
  // Starts argv[0] with arguments argv[1..]. `extra_env` entries
  // ("NAME=value") are added to the inherited environment.
  static absl::StatusOr<Subprocess> Start(
      const std::vector<std::string>& argv,
      const std::vector<std::string>& extra_env = {});

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  absl::Status Signal(int signal_number) const;

  // Waits for exit. Returns the exit code, 128 + signal for a signal death,
  // or DEADLINE_EXCEEDED (the child keeps running) after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  bool Running();

  std::string Stdout() const;
  std::string Stderr() const;

 private:
  Subprocess(pid_t pid, std::string stdout_path, std::string stderr_path);

  pid_t pid_;
  bool reaped_ = false;
  int exit_code_ = -1;
  std::string stdout_path_;
  std::string stderr_path_;
};

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Starts `argv`, waits up to `timeout` and collects its output.
absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              absl::Duration timeout = absl::Seconds(30));

}  // namespace hicache::testing
