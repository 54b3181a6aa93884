#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::client {

// Health of a daemon (or one of its services) as grpc.health.v1 reports it.
enum class ServingStatus { kUnknown, kServing, kNotServing, kServiceUnknown };

// "SERVING", "NOT_SERVING", ...
const char* ServingStatusName(ServingStatus status);

// How a client channel reaches the daemon.
struct ChannelOptions {
  // TCP ("host:port") targets use TLS, verified against the PEM CA bundle in
  // `tls_ca_file` (empty: the system's roots). `tls_cert_file` and
  // `tls_key_file` (both or neither) present a client certificate (mTLS, for
  // a daemon started with --tls_client_ca_file). `tls_server_name` overrides
  // the name checked against the server's certificate. Unix targets take
  // none of these.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_server_name;
  // Plain TCP, without TLS: only for tests (the daemon's
  // --insecure_tcp_for_testing).
  bool insecure_tcp = false;
  // Reads wait (up to their deadline) for a daemon that is not up yet; see
  // ServiceConfigJson() in client/cpp/endpoint.h.
  bool wait_for_ready = true;
};

// A C++ client for one hicached daemon. Thread-safe: gRPC stubs may be used
// from many threads. Every call takes a deadline; errors carry the gRPC code
// and message as an absl::Status with the same code.
//
// Retries are gRPC's own, from the channel's service config
// (ServiceConfigJson()): the reads (CheckHealth, GetStats, ...) retry on
// UNAVAILABLE and wait for the connection; nothing that changes the
// daemon's state is ever retried.
class HiCacheClient {
 public:
  // Connects lazily to `target` ("unix:/path" or "host:port"). Never blocks.
  // A TCP target uses TLS (ChannelOptions) unless `options.insecure_tcp`.
  // Fails (INVALID_ARGUMENT) on contradictory options or an unreadable
  // certificate file.
  static absl::StatusOr<std::unique_ptr<HiCacheClient>> Create(
      const std::string& target, const ChannelOptions& options);
  // The same, with default options but `insecure_tcp`.
  static absl::StatusOr<std::unique_ptr<HiCacheClient>> Create(
      const std::string& target, bool insecure_tcp = false);

  // A channel to `target` with the options above and the service config;
  // for stubs of one's own (e.g. Session).
  static absl::StatusOr<std::shared_ptr<grpc::Channel>> NewChannel(
      const std::string& target, const ChannelOptions& options = {});

  // The arguments every client channel gets: retries enabled,
  // ServiceConfigJson(wait_for_ready) as the default service config, and a
  // reconnect backoff of 100 ms to 1 s (a restarted daemon is found again
  // within about a second).
  static grpc::ChannelArguments ChannelArgs(bool wait_for_ready = true);

  // Wraps an existing channel (tests, custom credentials). Its retries are
  // what that channel was made with.
  explicit HiCacheClient(std::shared_ptr<grpc::Channel> channel);

  // grpc.health.v1 Check for `service` ("" = the whole daemon).
  absl::StatusOr<ServingStatus> CheckHealth(
      const std::string& service = "",
      absl::Duration timeout = absl::Seconds(5));

  absl::StatusOr<v1::GetStatsResponse> GetStats(
      absl::Duration timeout = absl::Seconds(5));

  // Blocks until the channel is connected or `timeout` passes.
  absl::Status WaitForConnected(absl::Duration timeout);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
};

}  // namespace hicache::client
