#pragma once

// A real hicached for two-process benchmarks: spawned as a separate process
// on a temporary socket (stopped with SIGTERM when destroyed), or an
// external daemon named by its socket.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hicache::bench {

class SpawnedDaemon {
 public:
  // `socket` non-empty: use that running daemon (nothing is spawned).
  // Otherwise spawn `binary` (empty: //daemon:hicached from the runfiles of
  // `argv0`) with `flags` on a fresh socket, its log in the temporary
  // directory. `name` labels the messages.
  static absl::StatusOr<std::unique_ptr<SpawnedDaemon>> Start(
      const char* argv0, const std::string& name, const std::string& socket,
      const std::string& binary, const std::vector<std::string>& flags);
  ~SpawnedDaemon();
  SpawnedDaemon(const SpawnedDaemon&) = delete;
  SpawnedDaemon& operator=(const SpawnedDaemon&) = delete;

  const std::string& socket() const { return socket_; }
  // The temporary directory ("" for an external daemon).
  const std::string& dir() const { return dir_; }
  // False once a spawned daemon has exited.
  bool Running() const;

 private:
  SpawnedDaemon() = default;
  std::string socket_;
  std::string dir_;
  pid_t pid_ = -1;
};

}  // namespace hicache::bench
