#include "daemon/service/leader_guard.h"

#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "daemon/service/rpc_scope.h"

namespace hicache::service {

grpc::Status LeaderGuard::Check(grpc::ServerContext* context,
                                absl::string_view rpc) const {
  const std::optional<RpcScope> scope =
      ScopeOfRpc(std::string_view(rpc.data(), rpc.size()));
  if (!scope.has_value() || *scope == RpcScope::kLocal) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat("leader guard on ", rpc,
                     ", which rpc_scope.h does not list as a tree RPC"));
  }
  if (role_ == nullptr || role_->IsLeader()) return grpc::Status::OK;
  const std::string leader = role_->LeaderAddress();
  if (leader.empty()) {
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat(rpc, ": not the CP group leader, and the leader is not "
                          "known yet; try again"));
  }
  if (!IsValidLeaderTarget(leader)) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat(rpc, ": not the CP group leader; the leader's address (",
                     leader.size(), " bytes) is not a valid gRPC target"));
  }
  context->AddTrailingMetadata(kLeaderTrailer, leader);
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("not the CP group leader; the leader is ", leader));
}

}  // namespace hicache::service
