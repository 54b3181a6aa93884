#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/subprocess.h"

namespace hicache::testing {

// Waits until the hicached process `daemon`, listening on the unix socket
// `socket`, answers GetStats: one attempt over a fresh channel (no reconnect
// backoff from attempts made before it listened) every 25 ms, for at most
// `timeout`, while the process runs. Returns a stub on the channel that
// answered; DEADLINE_EXCEEDED, or FAILED_PRECONDITION if the process
// exited, with its stderr otherwise.
absl::StatusOr<std::shared_ptr<v1::HiCache::Stub>> AwaitDaemon(
    Subprocess& daemon, const std::string& socket, absl::Duration timeout);

}  // namespace hicache::testing
