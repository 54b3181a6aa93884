#include "client/ctl/rpc_error.h"

#include <sys/stat.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/leader_redirect.h"

namespace hicache::ctl {

std::string GrpcCodeName(grpc::StatusCode code) {
  const int n = static_cast<int>(code);
  if (n < 0 || n > 16) return absl::StrCat("CODE_", n);
  // gRPC and absl share the canonical codes and their names.
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(n));
}

std::string DescribeRpcError(const grpc::Status& status,
                             const std::string& target,
                             const std::string& socket_path,
                             absl::Duration timeout,
                             const std::string& leader) {
  const std::string code = GrpcCodeName(status.error_code());
  const std::string& message = status.error_message();
  // Why a unix socket cannot be used, if that is why: missing, or a file
  // or directory this user may not use (then that is the whole story).
  const absl::Status socket = socket_path.empty()
                                  ? absl::OkStatus()
                                  : client::CheckSocket(socket_path);
  const bool socket_missing = absl::IsNotFound(socket);
  const bool follower_without_leader =
      message.find("not the CP group leader") != std::string::npos;
  if ((status.error_code() == grpc::StatusCode::UNAVAILABLE ||
       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
      !follower_without_leader &&
      (absl::IsPermissionDenied(socket) ||
       absl::IsFailedPrecondition(socket))) {
    return absl::StrCat(code, ": ", socket.message());
  }
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: {
      // A CP group follower that answered but does not know its leader yet
      // (daemon/service/leader_guard.cc words it so): not a missing daemon.
      if (follower_without_leader) {
        return absl::StrCat(code, ": ", message,
                            " (this daemon is a CP group follower that does "
                            "not know its leader yet; retry, or use --target "
                            "with the leader's address)");
      }
      if (!socket_path.empty()) {
        const bool exists = !socket_missing;
        // An existing socket nobody answers on: a stale file, or one this
        // user may not connect to; gRPC's message tells which.
        return absl::StrCat(
            code, ": no daemon ", exists ? "answering " : "", "at ",
            socket_path,
            exists ? absl::StrCat(" (", message, ")") : " (no such socket)",
            "; is hicached running? check --socket or --target (or "
            "HICACHE_SOCKET, HICACHE_TARGET)");
      }
      return absl::StrCat(code, ": cannot reach a daemon at ", target, ": ",
                          message,
                          " (is hicached listening on TCP there? check "
                          "--target and the --tls_* options)");
    }
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // Reads retry on UNAVAILABLE until the deadline: a missing daemon can
      // end here too.
      if (socket_missing) {
        return absl::StrCat(code, ": no daemon at ", socket_path,
                            " (no such socket); is hicached running? check "
                            "--socket or --target (or HICACHE_SOCKET, "
                            "HICACHE_TARGET)");
      }
      return absl::StrCat(
          code, ": no answer from ", target, " within ",
          absl::FormatDuration(timeout),
          socket_path.empty()
              ? " (is hicached listening on TCP there? check --target and "
                "the --tls_* options; raise --timeout for slow calls)"
              : " (is hicached running and not stuck? raise --timeout for "
                "slow calls)");
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StrCat(code, ": ", message,
                          " (operator RPCs need root or hicached "
                          "--operator_uids/--operator_gids; see "
                          "docs/security.md)");
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::StrCat(code, ": ", message,
                          " (the daemon rejected this client's identity; "
                          "check --tls_cert_file and --tls_key_file)");
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::StrCat(code, ": ", message,
                          " (the daemon refused the arguments; see "
                          "'hicachectl <command> --help')");
    case grpc::StatusCode::NOT_FOUND:
      return absl::StrCat(code, ": ", message,
                          " (it may have been evicted or closed; list nodes "
                          "with 'hicachectl tree')");
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::StrCat(code, ": ", message,
                          " (the daemon or the reply hit a limit; for tree, "
                          "use a smaller --limit)");
    case grpc::StatusCode::FAILED_PRECONDITION:
      if (!leader.empty() && client::IsValidLeaderTarget(leader)) {
        return absl::StrCat(code, ": ", message,
                            " (this daemon is a CP group follower; the "
                            "leader is ",
                            leader, " (use --target ", leader, "))");
      }
      return absl::StrCat(code, ": ", message);
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::StrCat(code, ": ", message,
                          " (the daemon is older than this hicachectl; "
                          "upgrade hicached)");
    default:
      return absl::StrCat(code, ": ", message);
  }
}

std::string LeaderOfCall(const grpc::Status& status,
                         const grpc::ClientContext& context) {
  return client::LeaderOf(client::StatusOfCall(status, context, ""))
      .value_or("");
}

}  // namespace hicache::ctl
