#include "bench/spawned_daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hicache::bench {
namespace {

std::string FindDaemon(const char* argv0) {
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(dir, "/hicache/daemon/hicached"));
  }
  candidates.push_back(absl::StrCat(argv0, ".runfiles/hicache/daemon/hicached"));
  candidates.push_back("daemon/hicached");  // bazel run's working directory.
  for (const std::string& path : candidates) {
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<SpawnedDaemon>> SpawnedDaemon::Start(
    const char* argv0, const std::string& name, const std::string& socket,
    const std::string& binary_flag, const std::vector<std::string>& flags) {
  auto daemon = std::unique_ptr<SpawnedDaemon>(new SpawnedDaemon());
  if (!socket.empty()) {
    daemon->socket_ = socket;
    return daemon;
  }
  const std::string binary =
      binary_flag.empty() ? FindDaemon(argv0) : binary_flag;
  if (binary.empty()) {
    return absl::NotFoundError(
        "hicached not found in the runfiles; pass --daemon or --socket");
  }
  std::string pattern = absl::StrCat("/tmp/hicache-", name, "-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError("mkdtemp");
  }
  daemon->dir_ = pattern;
  daemon->socket_ = daemon->dir_ + "/hicached.sock";
  std::vector<std::string> args = {binary, "--socket=" + daemon->socket_,
                                   "--log_level=warn"};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const std::string log = daemon->dir_ + "/hicached.log";
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  const int rc = posix_spawn(&daemon->pid_, binary.c_str(), &actions, nullptr,
                             argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
  }
  std::fprintf(stderr, "%s: started %s (pid %d) on %s\n", name.c_str(),
               binary.c_str(), daemon->pid_, daemon->socket_.c_str());
  return daemon;
}

SpawnedDaemon::~SpawnedDaemon() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  if (!dir_.empty()) {
    unlink((dir_ + "/hicached.log").c_str());
    rmdir(dir_.c_str());
  }
}

bool SpawnedDaemon::Running() const {
  return pid_ <= 0 || waitpid(pid_, nullptr, WNOHANG) == 0;
}

}  // namespace hicache::bench
