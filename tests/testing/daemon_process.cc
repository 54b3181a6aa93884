#include "tests/testing/daemon_process.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"

namespace hicache::testing {

absl::StatusOr<std::shared_ptr<v1::HiCache::Stub>> AwaitDaemon(
    Subprocess& daemon, const std::string& socket, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (!daemon.Running()) {
      return absl::FailedPreconditionError(
          absl::StrCat("hicached exited: ", daemon.Stderr()));
    }
    std::shared_ptr<v1::HiCache::Stub> stub =
        v1::HiCache::NewStub(grpc::CreateChannel(
            client::UnixTarget(socket), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    v1::GetStatsResponse stats;
    if (stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok()) return stub;
    absl::SleepFor(absl::Milliseconds(25));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("hicached did not come up: ", daemon.Stderr()));
}

}  // namespace hicache::testing
