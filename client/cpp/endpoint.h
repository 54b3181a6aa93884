#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace hicache::client {

// The daemon's default unix socket: $XDG_RUNTIME_DIR/hicached.sock when
// XDG_RUNTIME_DIR is set and non-empty, else /tmp/hicached.sock. hicached and
// every client agree on this path, so neither needs a flag on one machine.
std::string DefaultSocketPath();

// The gRPC target for a unix socket path: "unix:" + path.
std::string UnixTarget(absl::string_view socket_path);

}  // namespace hicache::client
