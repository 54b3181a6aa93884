#include "daemon/engine/engine_options.h"

#include <string>
#include <tuple>

#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/policies.h"
#include "daemon/engine/engine_types.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/field_count.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using testing::FieldCount;

// The DaemonConfig fields EngineOptionsFrom carries, and those it leaves to
// the daemon (socket, TLS, roles, limits, backend wiring, leases). A field
// added to DaemonConfig must be put in one list (and, if the engine takes
// it, carried by EngineOptionsFrom and checked below).
constexpr const char* kCarriedFields[] = {
    "page_size",
    "cp_size",
    "served_ranks",
    "kv_preset",
    "kv_families",
    "device_pages_per_rank",
    "host_pages_per_rank",
    "host_layout",
    "lock_host_memory",
    "write_policy",
    "write_through_threshold",
    "eviction_policy",
    "load_back_threshold_tokens",
    "l1_free_room_pages",
    "l2_free_room_pages",
    "namespace_quotas",
    "transfer_workers",
    "state_dir",
    "recovery_threads",
    "journal_settle_ms",  // EngineOptions::journal_settle.
    "storage_recompute_ns_per_token",
    "storage_prefetch",
    "storage_prefetch_timeout_ms",  // EngineOptions::storage_prefetch_timeout.
};
constexpr const char* kDaemonOnlyFields[] = {
    "backend",  // MakeBackend (daemon/main) builds the Backend.
    "gpus",
    "cuda_runtime",
    "copy_max_blocks",
    "pin_host_memory",
    "host_bytes_per_rank",  // Resolved into host_pages_per_rank first.
    "kv_layout_file",  // Read into kv_preset and kv_families by main.
    "default_lease_ms",     // SessionManager.
    "listen_tcp",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "insecure_tcp_for_testing",
    "paranoid_checks",  // DaemonServer's lease reaper.
    "instance",  // ShmInstance; the engine gets its prefix.
    "cp_group",  // CpGroupRuntime (daemon/main) adjusts the engine's ranks.
    "storage",  // OpenStorageStores (daemon/main) opens the stores.
    "operator_uids",
    "operator_gids",
    "operator_cert_names",
    "max_sessions",
    "max_namespaces",
    "max_streams_per_session",
    "max_items_per_request",
    "max_pages_per_request",
    "max_tokens_per_request",
    "max_pin_ttl_ms",
    "max_message_bytes",
    "max_connections",
    "max_rpc_threads",
    "max_stream_backlog",
    "metrics_address",  // DaemonMetrics (daemon/metrics) serves it.
    // KvEventPublisherOptionsFrom (daemon/events); main wires the publisher
    // in as the engine's tier listener with its block size and hash seed.
    "kv_events",
};
// EngineOptions fields that are process wiring, not configuration.
constexpr const char* kWiringFields[] = {
    "clock",          "backend",         "shm_prefix",
    "check_capacity", "write_back_wait", "wrap_transfer",
    "write_ahead_thread",  // Replays and tests run write-ahead inline.
    "observer",  // DaemonMetrics' layer timings, when metrics are on.
    // A CP group's leader: the ranks with pools here, set by the group's
    // wiring (docs/cp-groups.md), not by a flag.
    "pool_ranks",
    // KV events: the publisher main builds from DaemonConfig::kv_events.
    "tier_listener", "tier_block_size", "tier_hash_seed",
    // The storage tier: the stores main opens from DaemonConfig::storage.
    "storage",
};

TEST(EngineOptionsTest, EveryFieldIsClassified) {
  EXPECT_EQ(FieldCount<DaemonConfig>(),
            std::size(kCarriedFields) + std::size(kDaemonOnlyFields))
      << "DaemonConfig gained or lost a field: classify it above, and carry "
         "it in EngineOptionsFrom if the engine takes it";
  EXPECT_EQ(FieldCount<EngineOptions>(),
            std::size(kCarriedFields) + std::size(kWiringFields))
      << "EngineOptions gained or lost a field: give DaemonConfig (and its "
         "flag) the field and carry it in EngineOptionsFrom, or list it as "
         "wiring";
}

// Every carried field set to a value unlike its default (and unlike the
// others), so that a field left out or swapped shows.
DaemonConfig NonDefaultConfig() {
  DaemonConfig config;
  config.page_size = 16;
  config.cp_size = 4;
  config.served_ranks = {0, 1, 2, 3};  // All: state_dir needs every rank.
  config.kv_preset = "tiny-draft";
  config.kv_families = {{"k", 8, 3, false}, {"v", 8, 3, false}};
  config.device_pages_per_rank = 777;
  config.host_pages_per_rank = 9999;
  config.host_layout = HostLayout::kPageFirst;
  config.lock_host_memory = true;
  config.write_policy = WritePolicy::kWriteBack;
  config.write_through_threshold = 5;
  config.eviction_policy = EvictionPolicy::kSlru;
  config.load_back_threshold_tokens = 48;
  config.l1_free_room_pages = 11;
  config.l2_free_room_pages = 13;
  config.namespace_quotas = {{.ns = "tenant-a",
                              .device_limit = 100,
                              .device_guaranteed = 40,
                              .host_limit = 900,
                              .host_guaranteed = 300}};
  config.transfer_workers = 7;
  config.state_dir = "/var/lib/hicached";
  config.recovery_threads = 5;
  config.journal_settle_ms = 70;
  config.storage_recompute_ns_per_token = 1234;
  config.storage_prefetch = PrefetchPolicy::kTimeout;
  config.storage_prefetch_timeout_ms = 345;
  return config;
}

TEST(EngineOptionsTest, CarriesEveryConfigurationField) {
  const DaemonConfig config = NonDefaultConfig();
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  const EngineOptions o = EngineOptionsFrom(config);
  EXPECT_EQ(o.page_size, 16u);
  EXPECT_EQ(o.cp_size, 4u);
  EXPECT_THAT(o.served_ranks, ElementsAre(0u, 1u, 2u, 3u));
  EXPECT_EQ(o.kv_preset, "tiny-draft");
  EXPECT_EQ(o.kv_families, config.kv_families);
  EXPECT_EQ(o.device_pages_per_rank, 777);
  EXPECT_EQ(o.host_pages_per_rank, 9999);
  EXPECT_EQ(o.host_layout, HostLayout::kPageFirst);
  EXPECT_TRUE(o.lock_host_memory);
  EXPECT_EQ(o.write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(o.write_through_threshold, 5u);
  EXPECT_EQ(o.eviction_policy, EvictionPolicy::kSlru);
  EXPECT_EQ(o.load_back_threshold_tokens, 48);
  EXPECT_EQ(o.l1_free_room_pages, 11);
  EXPECT_EQ(o.l2_free_room_pages, 13);
  EXPECT_EQ(o.namespace_quotas, config.namespace_quotas);
  EXPECT_EQ(o.transfer_workers, 7);
  EXPECT_EQ(o.state_dir, "/var/lib/hicached");
  EXPECT_EQ(o.recovery_threads, 5);
  EXPECT_EQ(o.journal_settle, absl::Milliseconds(70));
  EXPECT_EQ(o.storage_recompute_ns_per_token, 1234);
  EXPECT_EQ(o.storage_prefetch, PrefetchPolicy::kTimeout);
  EXPECT_EQ(o.storage_prefetch_timeout, absl::Milliseconds(345));
  // Wiring is the caller's.
  const EngineOptions defaults;
  EXPECT_EQ(o.clock, nullptr);
  EXPECT_EQ(o.backend, nullptr);
  EXPECT_EQ(o.shm_prefix, "");
  EXPECT_EQ(o.check_capacity, defaults.check_capacity);
  EXPECT_EQ(o.write_back_wait, defaults.write_back_wait);
  EXPECT_FALSE(o.wrap_transfer);
}

// The configuration an EngineOptions carries, one element per entry of
// kCarriedFields (checked below), comparable as a whole.
auto Configuration(const EngineOptions& o) {
  return std::make_tuple(
      o.page_size, o.cp_size, o.served_ranks, o.kv_preset, o.kv_families,
      o.device_pages_per_rank, o.host_pages_per_rank, o.host_layout,
      o.lock_host_memory, o.write_policy, o.write_through_threshold,
      o.eviction_policy, o.load_back_threshold_tokens, o.l1_free_room_pages,
      o.l2_free_room_pages, o.namespace_quotas, o.transfer_workers,
      o.state_dir,
      o.recovery_threads, o.journal_settle,
      o.storage_recompute_ns_per_token, o.storage_prefetch,
      o.storage_prefetch_timeout);
}

TEST(EngineOptionsTest, DefaultsMatchTheDaemonsDefaults) {
  const DaemonConfig config;
  const EngineOptions o = EngineOptionsFrom(config);
  EXPECT_EQ(o.write_policy, WritePolicy::kWriteAhead);
  EXPECT_EQ(o.eviction_policy, EvictionPolicy::kTinyLfu);
  EXPECT_EQ(o.device_pages_per_rank, 4096);
  EXPECT_EQ(o.host_pages_per_rank, 16384);
  EXPECT_TRUE(o.served_ranks.empty());  // All ranks.
}

// One source of defaults: an engine built from EngineOptions{} (as most
// engine tests build theirs) runs exactly the configuration hicached
// ships, every carried field alike.
TEST(EngineOptionsTest, EngineOptionsDefaultIsTheDaemonsDefaultConfiguration) {
  static_assert(
      std::tuple_size_v<decltype(Configuration(EngineOptions{}))> ==
          std::size(kCarriedFields),
      "Configuration() must compare every carried field");
  DaemonConfig config;
  ASSERT_TRUE(config.Validate().ok());
  EXPECT_TRUE(Configuration(EngineOptions{}) ==
              Configuration(EngineOptionsFrom(config)))
      << "EngineOptions' defaults and DaemonConfig's differ: both take "
         "theirs from DaemonConfig::kDefault*";
  // The same values through the table itself.
  const EngineOptions o;
  EXPECT_EQ(o.write_policy, DaemonConfig::kDefaultWritePolicy);
  EXPECT_EQ(o.eviction_policy, DaemonConfig::kDefaultEvictionPolicy);
  EXPECT_EQ(o.kv_preset, DaemonConfig::kDefaultKvPreset);
}

TEST(EngineOptionsTest, PoolOptionsComeFromTheEngineOptions) {
  const EngineOptions o = EngineOptionsFrom(NonDefaultConfig());
  const RankPoolsOptions pools = RankPoolsOptionsFrom(o);
  EXPECT_EQ(pools.device_pages_per_rank, 777);
  EXPECT_EQ(pools.host_pages_per_rank, 9999);
  EXPECT_EQ(pools.host_layout, HostLayout::kPageFirst);
  EXPECT_TRUE(pools.lock_host_memory);
}

TEST(EngineOptionsTest, TreeOptionsTurnTheWritePolicyIntoAReportThreshold) {
  EngineOptions o = EngineOptionsFrom(NonDefaultConfig());
  FakeClock clock(absl::FromUnixSeconds(5));
  o.clock = &clock;
  RadixTreeOptions tree = RadixTreeOptionsFrom(o);
  EXPECT_EQ(tree.page_size, 16u);
  EXPECT_EQ(tree.cp_size, 4u);
  EXPECT_EQ(tree.policy, EvictionPolicy::kSlru);
  EXPECT_EQ(tree.clock, &clock);
  EXPECT_EQ(tree.reserve_tokens, 0);
  EXPECT_EQ(tree.write_through_threshold, 0u);  // Write-back: never.
  o.write_policy = WritePolicy::kWriteThrough;
  EXPECT_EQ(RadixTreeOptionsFrom(o).write_through_threshold, 1u);
  o.write_policy = WritePolicy::kWriteThroughSelective;
  EXPECT_EQ(RadixTreeOptionsFrom(o).write_through_threshold, 5u);
  o.write_through_threshold = 0;
  EXPECT_EQ(RadixTreeOptionsFrom(o).write_through_threshold, 1u);
}

}  // namespace
}  // namespace hicache
