#include "daemon/service/leader_guard.h"

#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/service/rpc_scope.h"

namespace hicache::service {
namespace {

bool IsHostName(absl::string_view host) {
  if (host.empty() || host.front() == '-' || host.front() == '.') return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' &&
        c != '.') {
      return false;
    }
  }
  return true;
}

bool IsIpv6Literal(absl::string_view inner) {
  if (inner.empty()) return false;
  for (char c : inner) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != ':' &&
        c != '.') {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IsValidLeaderTarget(absl::string_view target) {
  if (target.empty() || target.size() > kMaxLeaderAddressBytes) return false;
  constexpr absl::string_view kDns = "dns:///";
  if (target.substr(0, kDns.size()) == kDns) target.remove_prefix(kDns.size());
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos) return false;
  absl::string_view host = target.substr(0, colon);
  const absl::string_view port = target.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  int port_number = 0;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 1 ||
      port_number > 65535) {
    return false;
  }
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
    return IsIpv6Literal(host.substr(1, host.size() - 2));
  }
  return IsHostName(host);
}

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
