#pragma once

// The CP group leader redirect's wire contract (docs/api.md, "CP group
// leader redirect"), shared by the daemon that sends it
// (daemon/service/leader_guard.h) and the C++ clients that follow it
// (client/cpp/leader_redirect.h); the Python client applies the same rule
// (hicache.valid_leader_target). It lives beside the protos because both
// sides may depend on proto/ and on nothing of each other.

#include <cstddef>

#include "absl/strings/string_view.h"

namespace hicache {

// The gRPC trailing metadata key that carries the leader's address.
inline constexpr char kLeaderTrailer[] = "hicache-leader";
// The longest leader address the daemon sends and clients accept.
inline constexpr size_t kMaxLeaderAddressBytes = 255;

// True for a gRPC target a client may be redirected to: at most
// kMaxLeaderAddressBytes, "[dns:///]host:port" where host is a DNS name or
// IPv4 address ([A-Za-z0-9.-], not starting with '-' or '.') or a bracketed
// IPv6 literal ("[::1]"), and port is 1..65535. Nothing else: no unix
// sockets, schemes, user info, paths or control bytes, so that a hostile or
// broken daemon cannot send a client anywhere else.
bool IsValidLeaderTarget(absl::string_view target);

}  // namespace hicache
