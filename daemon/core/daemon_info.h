#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "daemon/core/build_info.h"
#include "daemon/core/daemon_config.h"

namespace hicache {

// What a running daemon reports about itself. Immutable after start-up.
struct DaemonInfo {
  BuildInfo build;
  DaemonConfig config;
  absl::Time start_time;       // When the daemon began serving.
  std::string listen_address;  // gRPC address, e.g. "unix:/tmp/hicached.sock".
  int64_t pid = 0;
};

}  // namespace hicache
