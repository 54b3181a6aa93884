#include "daemon/engine/engine_options.h"

#include <algorithm>

namespace hicache {

EngineOptions EngineOptionsFrom(const DaemonConfig& config) {
  EngineOptions options;
  options.page_size = config.page_size;
  options.cp_size = config.cp_size;
  options.kv_preset = config.kv_preset;
  options.kv_families = config.kv_families;
  options.state_dir = config.state_dir;
  options.recovery_threads = config.recovery_threads;
  options.journal_settle = absl::Milliseconds(config.journal_settle_ms);
  options.storage_recompute_ns_per_token =
      config.storage_recompute_ns_per_token;
  options.storage_prefetch = config.storage_prefetch;
  options.storage_prefetch_timeout =
      absl::Milliseconds(config.storage_prefetch_timeout_ms);
  options.device_pages_per_rank =
      static_cast<int64_t>(config.device_pages_per_rank);
  options.host_pages_per_rank =
      static_cast<int64_t>(config.host_pages_per_rank);
  options.host_layout = config.host_layout;
  options.lock_host_memory = config.lock_host_memory;
  options.write_policy = config.write_policy;
  options.write_through_threshold = config.write_through_threshold;
  options.eviction_policy = config.eviction_policy;
  options.load_back_threshold_tokens = config.load_back_threshold_tokens;
  options.l1_free_room_pages = config.l1_free_room_pages;
  options.l2_free_room_pages = config.l2_free_room_pages;
  options.namespace_quotas = config.namespace_quotas;
  options.served_ranks.assign(config.served_ranks.begin(),
                              config.served_ranks.end());
  options.transfer_workers = config.transfer_workers;
  return options;
}

RankPoolsOptions RankPoolsOptionsFrom(const EngineOptions& options) {
  return {.device_pages_per_rank = options.device_pages_per_rank,
          .host_pages_per_rank = options.host_pages_per_rank,
          .host_layout = options.host_layout,
          .lock_host_memory = options.lock_host_memory};
}

RadixTreeOptions RadixTreeOptionsFrom(const EngineOptions& options) {
  uint32_t report_threshold = 0;
  switch (options.write_policy) {
    case WritePolicy::kWriteThrough:
      report_threshold = 1;
      break;
    case WritePolicy::kWriteThroughSelective:
      report_threshold = std::max(1u, options.write_through_threshold);
      break;
    case WritePolicy::kWriteBack:
    case WritePolicy::kWriteAhead:
      report_threshold = 0;
      break;
  }
  return {.page_size = options.page_size,
          .cp_size = options.cp_size,
          .policy = options.eviction_policy,
          .write_through_threshold = report_threshold,
          .clock = options.clock,
          .reserve_tokens = 0,
          .sketch_pages = (options.device_pages_per_rank +
                           options.host_pages_per_rank) *
                          options.cp_size,
          .prefix_closed_host =
              options.write_policy == WritePolicy::kWriteAhead};
}

}  // namespace hicache
