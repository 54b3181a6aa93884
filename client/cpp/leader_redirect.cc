#include "client/cpp/leader_redirect.h"

#include <iterator>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hicache::client {
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
  if (absl::StartsWith(target, kDns)) target.remove_prefix(kDns.size());
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos) return false;
  const absl::string_view host = target.substr(0, colon);
  const absl::string_view port = target.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return false;
  }
  if (!host.empty() && host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
    return IsIpv6Literal(host.substr(1, host.size() - 2));
  }
  return IsHostName(host);
}

absl::Status StatusOfCall(const grpc::Status& status,
                          const grpc::ClientContext& context,
                          absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", status.error_message());
  std::optional<std::string> leader;
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    const auto& trailers = context.GetServerTrailingMetadata();
    const auto [begin, end] = trailers.equal_range(kLeaderTrailer);
    const auto count = std::distance(begin, end);
    if (count == 1) {
      const absl::string_view value(begin->second.data(),
                                    begin->second.size());
      if (IsValidLeaderTarget(value)) {
        leader = std::string(value);
      } else {
        absl::StrAppend(&message, " (the daemon named a leader of ",
                        value.size(),
                        " bytes that is not a valid target: not followed)");
      }
    } else if (count > 1) {
      absl::StrAppend(&message, " (the daemon named ", count,
                      " leaders: not followed)");
    }
  }
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   message);
  if (leader.has_value()) {
    out.SetPayload(kLeaderPayloadUrl, absl::Cord(*std::move(leader)));
  }
  return out;
}

std::optional<std::string> LeaderOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kLeaderPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  std::string leader(*payload);
  // A payload set by someone else is checked like a trailer.
  if (!IsValidLeaderTarget(leader)) return std::nullopt;
  return leader;
}

}  // namespace hicache::client
