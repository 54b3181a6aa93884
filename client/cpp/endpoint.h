#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace hicache::client {

// The daemon's default unix socket: $XDG_RUNTIME_DIR/hicached.sock when
// XDG_RUNTIME_DIR is set and non-empty, else /tmp/hicached.sock. hicached and
// every client agree on this path, so neither needs a flag on one machine.
std::string DefaultSocketPath();

// The gRPC target for a unix socket path: "unix:" + path.
std::string UnixTarget(absl::string_view socket_path);

// The packaged daemon's socket (deploy/hicached.flags and the .deb's unit).
inline constexpr absl::string_view kPackagedSocketPath =
    "/run/hicached/hicached.sock";

// Where a client finds the daemon. hicachectl, the C++ and Python clients
// and hicache-replay all resolve it in this order (docs/operations.md,
// "Finding the daemon"):
//  1. an explicit gRPC target (--target; unix:PATH or host:port);
//  2. an explicit unix socket (--socket);
//  3. $HICACHE_TARGET, any gRPC target (e.g. a daemon's TCP host:port);
//  4. $HICACHE_SOCKET, a unix socket path;
//  5. the packaged socket `packaged_path`, when it exists (also when this
//     user may not open it: then connecting says why);
//  6. DefaultSocketPath(), where a hicached started without --socket
//     listens.
// Empty strings and empty variables count as not given.
struct Endpoint {
  std::string target;       // The gRPC target.
  std::string socket_path;  // Its unix socket path; empty for TCP.
  std::string source;  // "--target", "--socket", "HICACHE_TARGET",
                       // "HICACHE_SOCKET", "packaged" or "default".
};
Endpoint ResolveEndpoint(absl::string_view target = "",
                         absl::string_view socket = "",
                         absl::string_view packaged_path = kPackagedSocketPath);

// The socket path of a unix gRPC target ("unix:/p", "unix:///p"), or "".
std::string SocketPathOf(absl::string_view target);

// Whether this process can connect to the unix socket at `path`, checked
// before a call so that the error says why (and comes at once):
//  - OK: it exists, is a socket, and this process may open it (which says
//    nothing about whether a daemon answers);
//  - NOT_FOUND "no daemon at PATH (no such socket)";
//  - PERMISSION_DENIED "permission denied: ...", naming the file or
//    directory this user may not use, its group and mode, and how to join
//    the group;
//  - FAILED_PRECONDITION when PATH is not a socket.
absl::Status CheckSocket(absl::string_view path);

// A gRPC method: its full service name and method name.
struct MethodName {
  absl::string_view service;  // e.g. "hicache.v1.HiCache".
  absl::string_view method;   // e.g. "GetStats".
};

// The methods gRPC itself retries (on UNAVAILABLE, with backoff) and lets
// wait for a connection: the reads (health Check, GetStats, Stats,
// GetLayout, DumpTree, InspectNode, ListSessions) and KeepAlive, which only
// extends a lease. The same set as READ_METHODS in the Python client
// (client/python/hicache/client.py).
//
// No other method is listed: a retried attempt may run twice (UNAVAILABLE
// can come after the daemon acted, e.g. when it drains or restarts
// mid-call), and Allocate, Free, Insert, Admit, Complete, Lock, Unlock,
// Evict, OpenSession... are not idempotent (a second Allocate takes more
// pages, a second Unlock releases another lock). MatchPrefix is not listed
// either: with lock=true it takes locks, and a service config cannot tell
// requests apart; Session sets wait_for_ready per call on the lock-free ones.
absl::Span<const MethodName> RetriedReadMethods();

// The attempts (first one included) of a retried read.
inline constexpr int kReadMaxAttempts = 5;

// The gRPC service config (JSON) of every client channel: the
// RetriedReadMethods() retry on UNAVAILABLE (kReadMaxAttempts, backoff
// 50 ms doubling up to 1 s) and, with `wait_for_ready`, wait up to their
// deadline for a daemon that is not listening yet instead of failing at
// once. Every other method is sent once and fails fast with UNAVAILABLE
// when the daemon cannot be reached.
std::string ServiceConfigJson(bool wait_for_ready = true);

}  // namespace hicache::client
