#include "client/ctl/connection.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/endpoint.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

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
  if (!options.target.empty()) {
    c.target = options.target;
  } else {
    c.socket_path = options.socket.empty() ? client::DefaultSocketPath()
                                           : options.socket;
    c.target = client::UnixTarget(c.socket_path);
  }
  if (absl::StartsWith(c.target, "unix:") && c.socket_path.empty()) {
    c.socket_path = c.target.substr(5);
    if (absl::StartsWith(c.socket_path, "//")) c.socket_path.erase(0, 2);
  }
  const bool any_tls = !options.tls_ca_file.empty() ||
                       !options.tls_cert_file.empty() ||
                       !options.tls_key_file.empty() ||
                       !options.tls_server_name.empty();
  const bool is_unix = absl::StartsWith(c.target, "unix:") ||
                       absl::StartsWith(c.target, "unix-abstract:");
  if (is_unix) {
    if (any_tls) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_* options apply to TCP targets only; ", c.target,
          " is a unix socket (the daemon's unix listener is not TLS)"));
    }
    c.channel = grpc::CreateChannel(c.target, grpc::InsecureChannelCredentials());
    return c;
  }
  if (options.insecure_tcp) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "--insecure_tcp_for_testing and --tls_* options contradict each "
          "other: choose one");
    }
    c.channel = grpc::CreateChannel(c.target, grpc::InsecureChannelCredentials());
    return c;
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file go together (mTLS needs both)");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(options.tls_ca_file, "--tls_ca_file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem(options.tls_cert_file, "--tls_cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem(options.tls_key_file, "--tls_key_file");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  c.channel = grpc::CreateCustomChannel(c.target, grpc::SslCredentials(ssl),
                                        args);
  return c;
}

}  // namespace hicache::ctl
