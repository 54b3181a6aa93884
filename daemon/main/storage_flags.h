#pragma once

#include "daemon/core/daemon_config.h"

namespace hicache {

// The storage tier's flags (--l3_dir, --l3_pages, --l3_io,
// --l3_queue_depth; docs/storage-tier.md), into `storage`.
void StorageConfigFromFlags(DaemonConfig::Storage* storage);

}  // namespace hicache
