#include "client/ctl/connection.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"

namespace hicache::ctl {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (buffer.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' is empty"));
  }
  return buffer.str();
}

}  // namespace

absl::StatusOr<Connection> Connect(const ConnectionOptions& options) {
  Connection c;
  // --target, --socket, $HICACHE_TARGET, $HICACHE_SOCKET, the packaged
  // socket if present, the default (client/cpp/endpoint.h).
  const client::Endpoint endpoint =
      client::ResolveEndpoint(options.target, options.socket);
  c.target = endpoint.target;
  c.socket_path = endpoint.socket_path;
  const bool any_tls =
      !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
      !options.tls_key_file.empty() || !options.tls_server_name.empty();
  const bool is_unix = absl::StartsWith(c.target, "unix:");
  if (is_unix && any_tls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_* options apply to TCP targets only; ", c.target,
        " is a unix socket (the daemon's unix listener is not TLS)"));
  }
  if (options.insecure_tcp && any_tls) {
    return absl::InvalidArgumentError(
        "--insecure_tcp_for_testing and --tls_* options contradict each "
        "other: choose one");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file go together (mTLS needs both)");
  }
  // Unreadable files are named by their flag here; the client library then
  // reads them again to build the credentials.
  for (const auto& [path, flag] :
       {std::pair{options.tls_ca_file, "--tls_ca_file"},
        std::pair{options.tls_cert_file, "--tls_cert_file"},
        std::pair{options.tls_key_file, "--tls_key_file"}}) {
    if (path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadPem(path, flag);
    if (!pem.ok()) return pem.status();
  }
  client::ChannelOptions channel_options;
  channel_options.tls_ca_file = options.tls_ca_file;
  channel_options.tls_cert_file = options.tls_cert_file;
  channel_options.tls_key_file = options.tls_key_file;
  channel_options.tls_server_name = options.tls_server_name;
  // (--insecure_tcp_for_testing is moot for a unix socket.)
  channel_options.insecure_tcp = options.insecure_tcp && !is_unix;
  // A command-line tool fails fast when no daemon listens (reads are still
  // retried on UNAVAILABLE by the service config).
  channel_options.wait_for_ready = false;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      client::HiCacheClient::NewChannel(c.target, channel_options);
  if (!channel.ok()) {
    return absl::InvalidArgumentError(channel.status().message());
  }
  c.channel = *std::move(channel);
  return c;
}

}  // namespace hicache::ctl
