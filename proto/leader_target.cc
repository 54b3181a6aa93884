#include "proto/leader_target.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace hicache {
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

}  // namespace hicache
