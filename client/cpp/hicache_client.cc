#include "client/cpp/hicache_client.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/endpoint.h"
#include "grpc/grpc.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace hicache::client {
namespace {

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(timeout));
}

absl::StatusOr<std::string> ReadPem(const std::string& path,
                                    absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

const char* ServingStatusName(ServingStatus status) {
  switch (status) {
    case ServingStatus::kUnknown:
      return "UNKNOWN";
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

grpc::ChannelArguments HiCacheClient::ChannelArgs(bool wait_for_ready) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetServiceConfigJSON(ServiceConfigJson(wait_for_ready));
  // Reconnect within about a second of a daemon coming back (gRPC's default
  // backoff grows to 120 s); calls waiting for ready wait for this too. The
  // "min reconnect backoff" is gRPC's minimum connect timeout (how long one
  // attempt may take to finish its handshake), not a delay: it stays at
  // gRPC's 20 s. At 100 ms, a daemon on a busy node that took longer to
  // answer failed the connection (leader_redirect_test under
  // tools/dev test --under-load: "connection attempt timed out before
  // receiving SETTINGS frame"). A refused connection still fails at once and
  // is retried after the backoff. As RECONNECT_BACKOFF in the Python client.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 20000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> HiCacheClient::NewChannel(
    const std::string& target, const ChannelOptions& options) {
  if (target.empty()) {
    return absl::InvalidArgumentError("target must not be empty");
  }
  grpc::ChannelArguments args = ChannelArgs(options.wait_for_ready);
  const bool tls_given =
      !options.tls_ca_file.empty() || !options.tls_cert_file.empty() ||
      !options.tls_key_file.empty() || !options.tls_server_name.empty();
  if (absl::StartsWith(target, "unix:")) {
    if (tls_given || options.insecure_tcp) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target '", target,
          "' is a unix socket: TLS options and insecure TCP apply to TCP "
          "targets only"));
    }
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                     args);
  }
  if (options.insecure_tcp) {
    if (tls_given) {
      return absl::InvalidArgumentError(
          "insecure TCP and TLS options exclude each other");
    }
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(),
                                     args);
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "mTLS needs both tls_cert_file and tls_key_file");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca_file.empty()) {
    absl::StatusOr<std::string> roots =
        ReadPem(options.tls_ca_file, "tls_ca_file");
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
  }
  if (!options.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert =
        ReadPem(options.tls_cert_file, "tls_cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadPem(options.tls_key_file, "tls_key_file");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

absl::StatusOr<std::unique_ptr<HiCacheClient>> HiCacheClient::Create(
    const std::string& target, const ChannelOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      NewChannel(target, options);
  if (!channel.ok()) return channel.status();
  return std::make_unique<HiCacheClient>(*std::move(channel));
}

absl::StatusOr<std::unique_ptr<HiCacheClient>> HiCacheClient::Create(
    const std::string& target, bool insecure_tcp) {
  ChannelOptions options;
  options.insecure_tcp = insecure_tcp && !absl::StartsWith(target, "unix:");
  return Create(target, options);
}

HiCacheClient::HiCacheClient(std::shared_ptr<grpc::Channel> channel)
    : channel_(std::move(channel)),
      stub_(v1::HiCache::NewStub(channel_)),
      health_stub_(grpc::health::v1::Health::NewStub(channel_)) {}

absl::StatusOr<ServingStatus> HiCacheClient::CheckHealth(
    const std::string& service, absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = health_stub_->Check(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    return ServingStatus::kServiceUnknown;
  }
  if (!status.ok()) return FromGrpc(status, "health check");
  switch (response.status()) {
    case grpc::health::v1::HealthCheckResponse::SERVING:
      return ServingStatus::kServing;
    case grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return ServingStatus::kNotServing;
    case grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return ServingStatus::kServiceUnknown;
    default:
      return ServingStatus::kUnknown;
  }
}

absl::StatusOr<v1::GetStatsResponse> HiCacheClient::GetStats(
    absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  v1::GetStatsResponse response;
  const grpc::Status status =
      stub_->GetStats(&context, v1::GetStatsRequest(), &response);
  if (!status.ok()) return FromGrpc(status, "GetStats");
  return response;
}

absl::Status HiCacheClient::WaitForConnected(absl::Duration timeout) {
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
  if (channel_->WaitForConnected(deadline)) return absl::OkStatus();
  return absl::DeadlineExceededError(
      absl::StrCat("could not connect within ", absl::FormatDuration(timeout)));
}

}  // namespace hicache::client
