#include "tests/testing/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace hicache::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string MakeTempFile(const char* tag) {
  std::string pattern = absl::StrCat("/tmp/hicache-", tag, "-XXXXXX");
  const int fd = mkstemp(pattern.data());
  if (fd >= 0) close(fd);
  return pattern;
}

}  // namespace

std::string RunfilePath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return absl::StrCat(srcdir, "/", workspace ? workspace : "hicache", "/",
                      workspace_relative);
}

absl::StatusOr<Subprocess> Subprocess::Start(
    const std::vector<std::string>& argv,
    const std::vector<std::string>& extra_env) {
  if (argv.empty()) return absl::InvalidArgumentError("argv is empty");
  std::string out_path = MakeTempFile("out");
  std::string err_path = MakeTempFile("err");

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null",
                                   O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_TRUNC, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_TRUNC, 0);
  // The child must not inherit a blocked signal mask from gRPC test threads.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  for (const std::string& e : extra_env)
    env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);

  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &actions, &attr,
                             args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(rc)));
  }
  return Subprocess(pid, std::move(out_path), std::move(err_path));
}

Subprocess::Subprocess(pid_t pid, std::string stdout_path,
                       std::string stderr_path)
    : pid_(pid),
      stdout_path_(std::move(stdout_path)),
      stderr_path_(std::move(stderr_path)) {}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_),
      reaped_(other.reaped_),
      exit_code_(other.exit_code_),
      stdout_path_(std::move(other.stdout_path_)),
      stderr_path_(std::move(other.stderr_path_)) {
  other.pid_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (!stdout_path_.empty()) unlink(stdout_path_.c_str());
  if (!stderr_path_.empty()) unlink(stderr_path_.c_str());
}

absl::Status Subprocess::Signal(int signal_number) const {
  if (kill(pid_, signal_number) != 0) {
    return absl::InternalError(absl::StrCat("kill: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool Subprocess::Running() {
  if (reaped_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    exit_code_ =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return exit_code_;
}

std::string Subprocess::Stdout() const { return ReadFile(stdout_path_); }
std::string Subprocess::Stderr() const { return ReadFile(stderr_path_); }

absl::StatusOr<RunResult> Run(const std::vector<std::string>& argv,
                              absl::Duration timeout) {
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  absl::StatusOr<int> code = process->Wait(timeout);
  if (!code.ok()) return code.status();
  return RunResult{*code, process->Stdout(), process->Stderr()};
}

}  // namespace hicache::testing
