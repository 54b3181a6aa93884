#pragma once

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/ctl/cache_commands.h"
#include "client/ctl/output_format.h"
#include "grpcpp/client_context.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::ctl {

// What every command's Run* uses to call the daemon and report.

// Sets the call's deadline `timeout` from now.
void Deadline(grpc::ClientContext* ctx, absl::Duration timeout);
// Prints a failed call's error (`leader`: the CP group leader the call
// named, or "") and returns kExitFailure.
int RpcError(const grpc::Status& status, const CommandContext& c,
             const std::string& leader = "");
// A raw stub call's error, with the leader its trailers named.
int RpcError(const grpc::Status& status, const grpc::ClientContext& ctx,
             const CommandContext& c);
// Prints a bad command line's message and returns kExitUsage.
int Usage(const CommandContext& c, const std::string& message);
// Prints exactly one JSON document.
void PrintJson(const Json& value, const CommandContext& c);
std::unique_ptr<v1::HiCache::Stub> Stub(const CommandContext& c);

}  // namespace hicache::ctl
