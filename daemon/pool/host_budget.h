#pragma once

// The host (L2) tier of one rank as the daemon's configuration sizes it:
// whole pages (--host_pages_per_rank) or one byte budget
// (--host_bytes_per_rank) that the target and draft payloads share.

#include <string>

#include "absl/status/statusor.h"
#include "daemon/core/daemon_config.h"
#include "daemon/pool/kv_geometry.h"

namespace hicache {

// The host tier `config` asks for, per rank, under its KV geometry
// (kv_preset at page_size): KvGeometry::SplitHostBudget(host_bytes_per_rank)
// when host_bytes_per_rank is set, else host_pages_per_rank whole pages.
// Errors: the preset's (unknown preset, bad page size); INVALID_ARGUMENT when
// the byte budget holds no host page (the message names the page's bytes:
// target and draft).
absl::StatusOr<HostBudget> HostBudgetOf(const DaemonConfig& config);

// HostBudgetOf(*config), and with a byte budget sets host_pages_per_rank to
// its pages. Idempotent: run it once after the flags are read (and again
// where a config arrives from elsewhere) before Validate().
absl::StatusOr<HostBudget> ResolveHostPages(DaemonConfig* config);

// One line for the start-up log, e.g. "host tier per rank: budget
// 1000000 bytes -> 976 pages of 1024 bytes, 62464 tokens each for target
// (999424 bytes) and draft (0 bytes), 576 bytes unused".
std::string DescribeHostBudget(const HostBudget& budget);

}  // namespace hicache
