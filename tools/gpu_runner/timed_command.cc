#include "tools/gpu_runner/timed_command.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "daemon/core/mutex.h"

namespace hicache::gpu_runner {
namespace {

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// The child's end: set by the waiter thread, waited for by RunTimed.
class ChildExit {
 public:
  void Set(int wait_status) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    status_ = wait_status;
    done_ = true;
    cv_.SignalAll();
  }
  // True when the child ended before `deadline`.
  bool WaitUntil(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    while (!done_) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      cv_.WaitWithTimeout(&mu_, left);
    }
    return true;
  }
  int status() const ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return status_;
  }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int status_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::string FindInPath(const std::string& name, const std::string& path) {
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::StatusOr<CommandResult> RunTimed(const CommandSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty argv");
  const int log_fd = open(spec.log_path.c_str(),
                          O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(
        absl::StrCat("open ", spec.log_path, ": ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, log_fd, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setpgroup(&attr, 0);  // Its own group: killed as a whole.
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> argv = CStrings(spec.argv);
  std::vector<char*> env = CStrings(spec.env);
  const absl::Time start = absl::Now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, &attr, argv.data(),
                             env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(log_fd);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("spawn ", spec.argv[0], ": ", std::strerror(rc)));
  }
  ChildExit exit;
  std::thread waiter([pid, &exit] {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    exit.Set(status);
  });
  CommandResult result;
  if (!exit.WaitUntil(start + spec.limit)) {
    result.timed_out = true;
    kill(-pid, SIGTERM);
    if (!exit.WaitUntil(absl::Now() + spec.grace)) kill(-pid, SIGKILL);
  }
  waiter.join();
  // Whatever the group left behind (a daemon a test started) goes too.
  kill(-pid, SIGKILL);
  result.elapsed = absl::Now() - start;
  const int status = exit.status();
  if (result.timed_out) {
    result.rc = 124;
  } else if (WIFEXITED(status)) {
    result.rc = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.rc = 128 + WTERMSIG(status);
  }
  return result;
}

}  // namespace hicache::gpu_runner
