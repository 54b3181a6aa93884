#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"

namespace hicache::ctl {

// Where and how hicachectl reaches the daemon (the global flags).
struct ConnectionOptions {
  // Empty: resolved as client::ResolveEndpoint does (environment, the
  // packaged socket, the default).
  std::string socket;         // --socket.
  std::string target;         // --target; any gRPC target, overrides --socket.
  bool insecure_tcp = false;  // --insecure_tcp_for_testing.
  std::string tls_ca_file;    // --tls_ca_file: PEM roots for the server.
  std::string tls_cert_file;  // --tls_cert_file: client cert (mTLS).
  std::string tls_key_file;   // --tls_key_file: its private key.
  std::string tls_server_name;  // --tls_server_name: expected server name.
};

// A channel and the target it was made for.
struct Connection {
  std::string target;       // e.g. "unix:/run/hicached/hicached.sock".
  std::string socket_path;  // The unix socket path; "" for TCP.
  std::shared_ptr<grpc::Channel> channel;
};

// Builds the channel with client::HiCacheClient::NewChannel (connects
// lazily; never blocks; reads retried on UNAVAILABLE by the service config,
// without waiting for a daemon that is not there). Unix targets are plain
// (the daemon authenticates unix peers by their credentials); a TCP target
// uses TLS with --tls_ca_file (or the system roots) and, with
// --tls_cert_file and --tls_key_file, a client certificate; plain TCP only
// with --insecure_tcp_for_testing. INVALID_ARGUMENT, naming the flag, for
// contradictory or unreadable options: hicachectl exits 2 on them.
absl::StatusOr<Connection> Connect(const ConnectionOptions& options);

}  // namespace hicache::ctl
