#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::client {

// Health of a daemon (or one of its services) as grpc.health.v1 reports it.
enum class ServingStatus { kUnknown, kServing, kNotServing, kServiceUnknown };

// "SERVING", "NOT_SERVING", ...
const char* ServingStatusName(ServingStatus status);

// A C++ client for one hicached daemon. Thread-safe: gRPC stubs may be used
// from many threads. Every call takes a deadline; errors carry the gRPC code
// and message as an absl::Status with the same code.
class HiCacheClient {
 public:
  // Connects lazily to `target` ("unix:/path" or "host:port"). Never blocks.
  // Plain TCP is used only when `insecure_tcp` is set; otherwise a host:port
  // target is refused until TLS support lands with the service API.
  static absl::StatusOr<std::unique_ptr<HiCacheClient>> Create(
      const std::string& target, bool insecure_tcp = false);

  // Wraps an existing channel (tests, custom credentials).
  explicit HiCacheClient(std::shared_ptr<grpc::Channel> channel);

  // grpc.health.v1 Check for `service` ("" = the whole daemon).
  absl::StatusOr<ServingStatus> CheckHealth(
      const std::string& service = "",
      absl::Duration timeout = absl::Seconds(5));

  absl::StatusOr<v1::GetStatsResponse> GetStats(
      absl::Duration timeout = absl::Seconds(5));

  // Blocks until the channel is connected or `timeout` passes.
  absl::Status WaitForConnected(absl::Duration timeout);

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
};

}  // namespace hicache::client
