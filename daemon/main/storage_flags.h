#pragma once

#include "daemon/core/daemon_config.h"

namespace hicache {

// The storage tier's flags (--l3_dir, --l3_pages, --l3_io,
// --l3_queue_depth, --l3_recompute_ns_per_token; docs/storage-tier.md),
// into `config`.
void StorageConfigFromFlags(DaemonConfig* config);

}  // namespace hicache
