#include "client/cpp/hicache_client.h"

#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::unique_ptr<HiCacheClient>> HiCacheClient::Create(
    const std::string& target, bool insecure_tcp) {
  if (target.empty()) {
    return absl::InvalidArgumentError("target must not be empty");
  }
  const bool is_unix = absl::StartsWith(target, "unix:");
  if (!is_unix && !insecure_tcp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target '", target,
        "' is not a unix socket; TCP needs TLS, which this client does not "
        "support yet (pass --insecure_tcp_for_testing only for tests)"));
  }
  return std::make_unique<HiCacheClient>(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
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
