#include "daemon/main/storage_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "daemon/core/policies.h"

ABSL_FLAG(std::string, l3_dir, "",
          "The storage tier (L3) below the host pool: a directory (absolute, "
          "created 0700) on a local NVMe for one preallocated file of "
          "--l3_pages pages per CP rank and its index. Pages the host tier "
          "lets go stay there across restarts and upgrades and are loaded "
          "back through the host tier. Empty: no storage tier.");
ABSL_FLAG(int64_t, l3_pages, 0,
          "--l3_dir: pages per rank (each the host tier's page, rounded up "
          "to 4 KiB on disk); the file system must have room for all of "
          "them at start.");
ABSL_FLAG(std::string, l3_io, "auto",
          "--l3_dir: how the files are read and written: io_uring with "
          "O_DIRECT, threads (pread/pwrite), or auto (io_uring where the "
          "kernel allows it).");
ABSL_FLAG(int, l3_queue_depth, 64, "--l3_dir: I/Os in flight per rank.");
ABSL_FLAG(hicache::PrefetchPolicy, l3_prefetch,
          hicache::PrefetchPolicy::kWaitComplete,
          "How a load waits for the pages the storage tier holds past the "
          "tree's hit: wait_complete (read them first), best_effort (read "
          "them in the background, do not wait: a later load finds them in "
          "the host tier) or timeout (wait up to --l3_prefetch_timeout_ms).");
ABSL_FLAG(int, l3_prefetch_timeout_ms, 100,
          "--l3_prefetch=timeout: the longest a load waits for its reads.");
ABSL_FLAG(std::string, l3_redis, "",
          "A storage tier (L3) shared between nodes instead of --l3_dir: a "
          "Redis or Valkey server or cluster, \"unix:/path/to/socket\" or "
          "\"host:port\". Daemons of one KV layout find each other's "
          "prefixes there. Size it with the server's maxmemory and an "
          "allkeys-lru policy.");
ABSL_FLAG(std::string, l3_redis_key_prefix, "hicache:",
          "--l3_redis: the prefix of every key (a deployment's own key "
          "space on a shared server).");
ABSL_FLAG(int64_t, l3_recompute_ns_per_token,
          hicache::DaemonConfig::kDefaultStorageRecomputeNsPerToken,
          "--l3_dir: what recomputing one token's KV costs (ns). A load from "
          "the storage tier whose reads, at their measured cost, would take "
          "longer than recomputing its tokens is not started (counted as "
          "refused). 0: always load.");

namespace hicache {

void StorageConfigFromFlags(DaemonConfig* config) {
  DaemonConfig::Storage* storage = &config->storage;
  config->storage_prefetch = absl::GetFlag(FLAGS_l3_prefetch);
  config->storage_prefetch_timeout_ms =
      absl::GetFlag(FLAGS_l3_prefetch_timeout_ms);
  config->storage_recompute_ns_per_token =
      absl::GetFlag(FLAGS_l3_recompute_ns_per_token);
  storage->dir = absl::GetFlag(FLAGS_l3_dir);
  storage->pages_per_rank = absl::GetFlag(FLAGS_l3_pages);
  storage->io = absl::GetFlag(FLAGS_l3_io);
  storage->queue_depth = absl::GetFlag(FLAGS_l3_queue_depth);
  storage->redis_address = absl::GetFlag(FLAGS_l3_redis);
  storage->redis_key_prefix = absl::GetFlag(FLAGS_l3_redis_key_prefix);
}

}  // namespace hicache
