#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache::testing {

// A private redis-server (Debian's /usr/bin/redis-server) on a unix socket
// in a temporary directory, without persistence; stopped (SIGKILL) on
// destruction.
class RedisServer {
 public:
  // Starts it and waits (a condition: the socket answers PING, within
  // `timeout`) until it serves. UNAVAILABLE without a redis-server binary.
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start();
  ~RedisServer();

  // The address RedisPageStoreOptions takes: "unix:<socket>".
  std::string address() const { return "unix:" + socket_; }
  const std::string& socket() const { return socket_; }

  // Stops the server (SIGKILL); Restart starts it again on the same socket.
  void Kill();
  absl::Status Restart();

  // Runs one command on a fresh connection (tests poke at values directly);
  // the reply as text ("(nil)", an integer, a status or a string).
  absl::StatusOr<std::string> Command(
      const std::vector<std::string>& argv) const;

 private:
  RedisServer() = default;
  absl::Status Launch();

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace hicache::testing
