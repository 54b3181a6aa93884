#pragma once

// Small pieces the daemon's gRPC wiring shares (daemon/main only).

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"

namespace hicache {

// A gRPC status as an absl::Status (same code and message).
inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// The whole of a credentials file (PEM certificate, key or CA bundle);
// FAILED_PRECONDITION "cannot read PATH" when it cannot be read.
inline absl::StatusOr<std::string> ReadCredentialsFile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace hicache
