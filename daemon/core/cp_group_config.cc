#include "daemon/core/cp_group_config.h"

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hicache {
namespace {

constexpr size_t kMaxNameBytes = 128;

// [A-Za-z0-9_.-], 1..kMaxNameBytes: names travel into rendezvous keys and
// log lines.
bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '-' && c != '.') {
      return false;
    }
  }
  return true;
}

// "host:port" or "[v6]:port" with a port in [1, 65535].
bool IsHostPort(absl::string_view target) {
  const size_t colon = target.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  // 1-5 ASCII digits: SimpleAtoi alone would take " 7000" or "7000\n".
  const absl::string_view digits = target.substr(colon + 1);
  if (digits.empty() || digits.size() > 5) return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  uint32_t port = 0;
  if (!absl::SimpleAtoi(digits, &port)) return false;
  if (port == 0 || port > 65535) return false;
  for (char c : target.substr(0, colon)) {
    if (absl::ascii_iscntrl(static_cast<unsigned char>(c)) || c == ' ' ||
        c == '/') {
      return false;
    }
  }
  return target.size() <= 256;
}

// An address ("10.0.0.2", "fe80::1"), a host or an interface ("eth1").
bool IsValidBind(absl::string_view bind) {
  if (bind.empty() || bind.size() > 64) return false;
  for (char c : bind) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '-' && c != '.' && c != ':') {
      return false;
    }
  }
  return true;
}

absl::Status Invalid(absl::string_view flag, absl::string_view want,
                     absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " must be ", want, ", got '", absl::CEscape(got), "'"));
}

}  // namespace

absl::Status CpGroupConfig::Validate() const {
  if (!enabled()) {
    if (!leader.empty() || !advertise.empty() || !member.empty()) {
      return absl::InvalidArgumentError(
          "cp_group_leader, cp_group_advertise and cp_group_member need "
          "cp_group (the group's name)");
    }
    return absl::OkStatus();
  }
  if (!IsValidName(name)) {
    return Invalid("cp_group", "1-128 characters of [A-Za-z0-9_.-]", name);
  }
  if (!member.empty() && !IsValidName(member)) {
    return Invalid("cp_group_member", "1-128 characters of [A-Za-z0-9_.-]",
                   member);
  }
  if (!leader.empty() && !IsHostPort(leader)) {
    return Invalid("cp_group_leader", "the leader's host:port", leader);
  }
  if (!advertise.empty() && !IsHostPort(advertise)) {
    return Invalid("cp_group_advertise", "host:port", advertise);
  }
  if (!IsValidBind(bind)) {
    return Invalid("cp_group_bind",
                   "an IP address, host or interface name (1-64 characters "
                   "of [A-Za-z0-9_.:-])",
                   bind);
  }
  if (heartbeat_ms < 1 || heartbeat_ms > 60000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_group_heartbeat_ms must be in [1, 60000], got ", heartbeat_ms));
  }
  if (timeout_ms <= heartbeat_ms || timeout_ms > 600000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_group_timeout_ms must be above cp_group_heartbeat_ms (",
        heartbeat_ms, ") and at most 600000, got ", timeout_ms));
  }
  if (join_timeout_ms < 1000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_group_join_timeout_ms must be at least 1000, got ",
        join_timeout_ms));
  }
  if (step_timeout_ms != 0 && step_timeout_ms <= heartbeat_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_group_step_timeout_ms must be 0 (none) or above "
        "cp_group_heartbeat_ms, got ",
        step_timeout_ms));
  }
  return absl::OkStatus();
}

}  // namespace hicache
