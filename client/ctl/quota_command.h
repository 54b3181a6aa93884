#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "client/ctl/cache_commands.h"

namespace hicache::ctl {

// hicachectl quota: per-namespace page quotas (docs/quotas.md). Without
// options: every namespace's usage against its quota. With --ns and page
// options: sets that namespace's quota, options not given keeping their
// values; --clear removes it. Operators only (the daemon says so).
struct QuotaOptions {
  std::optional<std::string> ns;
  std::optional<int64_t> device_limit;
  std::optional<int64_t> device_guaranteed;
  std::optional<int64_t> host_limit;
  std::optional<int64_t> host_guaranteed;
  bool clear = false;
};
int RunQuota(const QuotaOptions& options, const CommandContext& c);

}  // namespace hicache::ctl
