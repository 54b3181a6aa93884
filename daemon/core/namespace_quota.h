#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache {

// One namespace's page quota (docs/quotas.md). Pages are logical pages (one
// page of one lane), summed over lanes; 0 means "none" for each field.
//
// - A limit caps what the namespace holds in a tier: device pages of its
//   cached nodes and of its sessions' requests; host pages of its copies
//   and backups in flight. An allocation, load or backup that would pass it
//   first evicts the namespace's own pages, and is refused if that is not
//   enough.
// - A guarantee is what eviction for anyone else's need leaves it: a
//   flooding tenant cannot push it below its guaranteed pages.
struct NamespaceQuota {
  std::string ns;  // "" is the default namespace.
  int64_t device_limit = 0;
  int64_t device_guaranteed = 0;
  int64_t host_limit = 0;
  int64_t host_guaranteed = 0;

  // Every field 0: no quota (setting it removes the namespace's quota).
  bool empty() const {
    return device_limit == 0 && device_guaranteed == 0 && host_limit == 0 &&
           host_guaranteed == 0;
  }
  bool operator==(const NamespaceQuota&) const = default;
};

// INVALID_ARGUMENT for a negative field, or a guarantee above the limit of
// its tier where both are set.
absl::Status ValidateNamespaceQuota(const NamespaceQuota& quota);

// Parses one --namespace_quota entry: "NS:KEY=PAGES[,KEY=PAGES...]" with
// keys device_limit, device_guaranteed, host_limit and host_guaranteed
// (missing keys are 0). NS is everything before the last ':' and may be
// empty (the default namespace). INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<NamespaceQuota> ParseNamespaceQuota(absl::string_view spec);

// The inverse of ParseNamespaceQuota (keys that are 0 left out).
std::string FormatNamespaceQuota(const NamespaceQuota& quota);

}  // namespace hicache
