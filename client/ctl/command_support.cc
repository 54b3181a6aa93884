#include "client/ctl/command_support.h"

#include <chrono>

#include "client/cpp/leader_redirect.h"
#include "client/ctl/cli.h"
#include "client/ctl/rpc_error.h"

namespace hicache::ctl {

void Deadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(timeout));
}

int RpcError(const grpc::Status& status, const CommandContext& c,
             const std::string& leader) {
  *c.err << "hicachectl: "
         << DescribeRpcError(status, c.target, c.socket_path, c.timeout,
                             leader)
         << "\n";
  return kExitFailure;
}

int RpcError(const grpc::Status& status, const grpc::ClientContext& ctx,
             const CommandContext& c) {
  return RpcError(status, c, LeaderOfCall(status, ctx));
}

int Usage(const CommandContext& c, const std::string& message) {
  *c.err << "hicachectl: " << message << "; run 'hicachectl --help'\n";
  return kExitUsage;
}

void PrintJson(const Json& value, const CommandContext& c) {
  *c.out << JsonLine(value) << "\n";
}

std::unique_ptr<v1::HiCache::Stub> Stub(const CommandContext& c) {
  return v1::HiCache::NewStub(c.channel);
}

}  // namespace hicache::ctl
