#include "daemon/core/namespace_quota.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace hicache {

absl::Status ValidateNamespaceQuota(const NamespaceQuota& quota) {
  if (quota.device_limit < 0 || quota.device_guaranteed < 0 ||
      quota.host_limit < 0 || quota.host_guaranteed < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quota of namespace '", quota.ns, "': page counts must be >= 0"));
  }
  if (quota.device_limit > 0 && quota.device_guaranteed > quota.device_limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quota of namespace '", quota.ns, "': device_guaranteed (",
        quota.device_guaranteed, ") is above device_limit (",
        quota.device_limit, ")"));
  }
  if (quota.host_limit > 0 && quota.host_guaranteed > quota.host_limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quota of namespace '", quota.ns, "': host_guaranteed (",
        quota.host_guaranteed, ") is above host_limit (", quota.host_limit,
        ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<NamespaceQuota> ParseNamespaceQuota(absl::string_view spec) {
  const size_t colon = spec.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace quota '", spec,
        "' is not NS:KEY=PAGES[,KEY=PAGES...] (no ':')"));
  }
  NamespaceQuota quota;
  quota.ns = std::string(spec.substr(0, colon));
  const absl::string_view fields = spec.substr(colon + 1);
  if (fields.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace quota '", spec, "' sets nothing"));
  }
  for (absl::string_view field : absl::StrSplit(fields, ',')) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(field, absl::MaxSplits('=', 1));
    int64_t pages = 0;
    if (!absl::SimpleAtoi(kv.second, &pages)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace quota '", spec, "': '", field, "' is not KEY=PAGES"));
    }
    int64_t* slot = nullptr;
    if (kv.first == "device_limit") slot = &quota.device_limit;
    if (kv.first == "device_guaranteed") slot = &quota.device_guaranteed;
    if (kv.first == "host_limit") slot = &quota.host_limit;
    if (kv.first == "host_guaranteed") slot = &quota.host_guaranteed;
    if (slot == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace quota '", spec, "': unknown key '", kv.first,
          "' (device_limit, device_guaranteed, host_limit, host_guaranteed)"));
    }
    *slot = pages;
  }
  if (absl::Status s = ValidateNamespaceQuota(quota); !s.ok()) return s;
  return quota;
}

std::string FormatNamespaceQuota(const NamespaceQuota& quota) {
  std::vector<std::string> fields;
  auto add = [&](absl::string_view key, int64_t pages) {
    if (pages != 0) fields.push_back(absl::StrCat(key, "=", pages));
  };
  add("device_limit", quota.device_limit);
  add("device_guaranteed", quota.device_guaranteed);
  add("host_limit", quota.host_limit);
  add("host_guaranteed", quota.host_guaranteed);
  return absl::StrCat(quota.ns, ":", absl::StrJoin(fields, ","));
}

}  // namespace hicache
