#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/core/cp_group_config.h"
#include "daemon/core/kv_layout.h"
#include "daemon/core/namespace_quota.h"
#include "daemon/core/policies.h"

namespace hicache {

// Where the KV pools live and how bytes move between them.
enum class BackendKind {
  kCpu,   // Shared-memory segments stand in for device memory; memcpy copies.
  kCuda,  // Device memory, pinned host memory and CUDA copy streams.
};

// Byte order of a rank's host pool.
enum class HostLayout {
  kLayerFirst,  // One region per layer; pages in order inside it.
  kPageFirst,   // All layers of one page contiguous.
};

absl::string_view BackendName(BackendKind backend);                // "cpu" | "cuda"
absl::StatusOr<BackendKind> ParseBackend(absl::string_view text);  // inverse
absl::string_view HostLayoutName(HostLayout layout);  // "layer_first" | ...
absl::StatusOr<HostLayout> ParseHostLayout(absl::string_view text);

// Abseil flag marshalling, so --backend=gpu fails at flag parsing with the
// list of valid values.
bool AbslParseFlag(absl::string_view text, BackendKind* backend,
                   std::string* error);
std::string AbslUnparseFlag(BackendKind backend);
bool AbslParseFlag(absl::string_view text, HostLayout* layout,
                   std::string* error);
std::string AbslUnparseFlag(HostLayout layout);

// Instance ids name a daemon's shared-memory segments
// ("/hicache-<instance>-device-r0", ...): 1 to kMaxInstanceIdLength
// characters of [A-Za-z0-9_-], starting with a letter (so that they never
// look like the pid-based names of daemon-less engines).
inline constexpr size_t kMaxInstanceIdLength = 64;
bool IsValidInstanceId(absl::string_view id);
// The default instance id of a daemon serving `canonical_socket_path` (an
// absolute path without symlinks): the socket's file name without ".sock",
// reduced to [A-Za-z0-9_-], then '-' and 12 hex digits of a stable 64-bit
// hash (FNV-1a) of the whole path, e.g. "hicached-3fa2b1c09d4e". The same
// path always gives the same id; different paths give different ids.
std::string DefaultInstanceId(absl::string_view canonical_socket_path);

// The Prometheus endpoint address (--metrics_address): "IPV4:PORT", an IPv4
// literal (no host names: the HTTP server does not resolve them; no IPv6:
// Debian's civetweb is built without it) and a decimal port in [0, 65535]
// (0 picks a free port).
// OK, or INVALID_ARGUMENT saying what is wrong with `address`.
absl::Status CheckMetricsAddress(absl::string_view address);

// Static configuration of one daemon: backend and pool geometry. Plain value
// type; Validate() before use.
struct DaemonConfig {
  // Upper bounds that keep every derived quantity far from overflow.
  static constexpr uint32_t kMaxPageSize = 1u << 16;
  static constexpr uint32_t kMaxCpSize = 256;
  static constexpr uint64_t kMaxPagesPerRank = uint64_t{1} << 40;

  // The defaults, in one table: the fields below and EngineOptions
  // (daemon/engine/engine_options.h) both start from these, so an engine
  // built without a DaemonConfig runs what the daemon ships
  // (engine_options_test checks that they agree).
  static constexpr uint32_t kDefaultPageSize = 64;
  static constexpr uint32_t kDefaultCpSize = 1;
  static constexpr uint64_t kDefaultDevicePagesPerRank = 4096;
  static constexpr uint64_t kDefaultHostPagesPerRank = 16384;
  static constexpr absl::string_view kDefaultKvPreset = "tiny";
  static constexpr EvictionPolicy kDefaultEvictionPolicy =
      EvictionPolicy::kTinyLfu;
  static constexpr WritePolicy kDefaultWritePolicy = WritePolicy::kWriteAhead;
  static constexpr uint32_t kDefaultWriteThroughThreshold = 2;
  static constexpr int32_t kDefaultTransferWorkers = 2;
  static constexpr int kDefaultRecoveryThreads = 2;
  static constexpr int kDefaultJournalSettleMs = 20;
  // The storage tier's cost model (docs/storage-tier.md §1): what
  // recomputing a token's KV costs, about a mid-size model's prefill on one
  // current GPU.
  static constexpr int64_t kDefaultStorageRecomputeNsPerToken = 20000;

  BackendKind backend = BackendKind::kCpu;
  uint32_t page_size = kDefaultPageSize;  // Tokens per page, P.
  uint32_t cp_size = kDefaultCpSize;  // Context-parallel size, C (lanes).
  // Ranks whose pools this daemon owns, ascending. Empty means all C ranks.
  std::vector<uint32_t> served_ranks;
  // CUDA backend: the device ordinal of each served rank, in served-rank
  // order. Empty: rank r on device r.
  std::vector<int32_t> gpus;
  // CUDA backend: "real" (the CUDA runtime) or "simulated" (the CPU
  // simulation of it: tests and demos on machines without a GPU).
  std::string cuda_runtime = "real";
  // CUDA backend: thread blocks per copy launch, 0 for the kernel's default
  // (a quota that keeps copies from occupying every SM).
  int32_t copy_max_blocks = 0;
  // Page-lock the host pools: mlock on the CPU backend (default off),
  // cudaHostRegister on the CUDA backend (default on; the copy kernel needs
  // pinned memory).
  bool lock_host_memory = false;
  bool pin_host_memory = true;
  uint64_t device_pages_per_rank = kDefaultDevicePagesPerRank;
  // The host (L2) tier of each rank, in pages or as one byte budget. A host
  // page holds the target *and* the draft payload of its tokens
  // (KvGeometry), so one budget sizes both: when host_bytes_per_rank is
  // non-zero it wins, and ResolveHostPages (daemon/pool/host_budget.h) sets
  // host_pages_per_rank to the pages it holds (--host_bytes_per_rank and
  // --host_pages_per_rank together are refused at flag parsing).
  uint64_t host_pages_per_rank = kDefaultHostPagesPerRank;
  uint64_t host_bytes_per_rank = 0;
  HostLayout host_layout = HostLayout::kLayerFirst;
  // The KV layout: a preset (see KvGeometry::Preset; "tiny" keeps the
  // embedded default's pools at a few MB), or, when kv_families is not
  // empty, those families under the name kv_preset (read from
  // kv_layout_file, --kv_layout_file; docs/kv-layouts.md).
  std::string kv_preset = std::string(kDefaultKvPreset);
  std::vector<KvFamily> kv_families;
  std::string kv_layout_file;  // Where kv_families came from, for logs.
  // Engine policies, parsed once from their flags (core/policies.h).
  // The default pair (docs/eviction.md): write-ahead (a prefix-closed host
  // tier that survives a crash, no allocation waiting for a copy), TinyLFU
  // on the host tier.
  NamedPolicy<EvictionPolicy> eviction_policy = kDefaultEvictionPolicy;
  NamedPolicy<WritePolicy> write_policy = kDefaultWritePolicy;
  // Hits before a node is written through (write_through_selective).
  uint32_t write_through_threshold = kDefaultWriteThroughThreshold;
  // Loads of fewer tokens are reported as misses (not worth a transfer).
  int64_t load_back_threshold_tokens = 0;
  // After pressure, evict until this many pages are free per lane (L1) and
  // per rank (L2); SetFreeRoom changes them at run time.
  int64_t l1_free_room_pages = 0;
  int64_t l2_free_room_pages = 0;
  // Per-namespace page quotas at start (--namespace_quota; docs/quotas.md);
  // the SetQuota RPC changes them at run time. None by default.
  std::vector<NamespaceQuota> namespace_quotas;
  // CPU backend: memcpy threads.
  int32_t transfer_workers = kDefaultTransferWorkers;
  // Session lease when a client asks for none.
  uint32_t default_lease_ms = 10000;
  // Optional TCP listener ("host:port"), in addition to the unix socket.
  // TCP requires TLS (cert + key; a client CA makes it mutual TLS) unless
  // insecure_tcp_for_testing is set.
  std::string listen_tcp;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  bool insecure_tcp_for_testing = false;
  // After every lease expiry, check the engine's invariants and log the
  // result (O(cached nodes); tests and debugging).
  bool paranoid_checks = false;
  // Shared-memory instance id (see IsValidInstanceId). Empty: derived from
  // the socket path by DefaultInstanceId().
  std::string instance;
  // Prometheus /metrics over HTTP at this address (see CheckMetricsAddress);
  // empty: no metrics endpoint. Plain HTTP without authentication: bind it
  // to loopback or a scrape-only network.
  std::string metrics_address;
  // Hot restart (docs/hot-restart.md): where the host tier's journal lives
  // (created 0700 if absent); empty: the host tier dies with the daemon.
  std::string state_dir;
  int recovery_threads = kDefaultRecoveryThreads;  // Verifying host pages at start, 1..64.
  // How long a host commit waits before it is journaled (0..10000 ms): one
  // evicted within it is never recorded; a crash loses the commits of about
  // this long (their pages are free after the restart).
  int journal_settle_ms = kDefaultJournalSettleMs;
  // The storage tier (L3, docs/storage-tier.md): a file store per rank in
  // storage.dir (created 0700 if absent), of storage.pages_per_rank pages,
  // below the host tier, or a shared Redis store. Neither: no storage tier.
  struct Storage {
    std::string dir;
    int64_t pages_per_rank = 0;
    // Or a store shared between nodes: a Redis/Valkey server or cluster
    // ("unix:/path", "host:port"), keys under redis_key_prefix. Exclusive
    // with dir.
    std::string redis_address;
    std::string redis_key_prefix = "hicache:";
    std::string io = "auto";  // auto (io_uring, else threads), io_uring, threads
    int queue_depth = 64;     // 1..4096
  } storage;
  // A promotion from the storage tier is not started when reading its bytes
  // (at the measured read cost) would take longer than recomputing its
  // tokens at this cost; 0 turns the cost model off.
  int64_t storage_recompute_ns_per_token = kDefaultStorageRecomputeNsPerToken;
  // How loads wait for the storage tier's pages (PrefetchPolicy), and how
  // long under kTimeout (0..60000 ms).
  PrefetchPolicy storage_prefetch = PrefetchPolicy::kWaitComplete;
  int storage_prefetch_timeout_ms = 100;
  // KV events for cluster routers (docs/kv-events.md), in vLLM's ZMQ
  // format: off while kv_events_endpoint is empty.
  struct KvEvents {
    std::string endpoint;         // PUB: bound if it holds '*', ipc://, ...
    std::string replay_endpoint;  // ROUTER (bound); empty: no replay.
    // A namespace's topic: {instance}, {model}, {namespace} (kv_event_topics.h).
    std::string topic = "kv@{instance}@{model}";
    std::string instance;  // Default {instance}; empty: the host name.
    std::string model;     // Default {model}; empty: the namespace.
    uint32_t block_size = 0;  // Tokens per block (divides the page); 0: P.
    uint64_t hash_seed = 0;   // Of the block hashes (block_hashes.h).
    std::string device_medium = "GPU";  // vLLM 0.33's MEDIUM_GPU.
    std::string host_medium = "CPU";    // vLLM 0.33's MEDIUM_CPU.
    int64_t data_parallel_rank = 0;
    int64_t buffer_batches = 10000;  // Kept for replay.
    int64_t hwm = 100000;            // PUB high-water mark.
    int64_t max_queued_events = 100000;
  } kv_events;
  // A CP group of several daemons (docs/cp-groups.md). A leader needs
  // listen_tcp (its followers and schedulers reach it there); a follower
  // needs served_ranks (the ranks whose pools it holds). Not with state_dir.
  CpGroupConfig cp_group;

  // Operators may act across tenants (evict, free room, tree dumps, session
  // lists, watch): root, these uids, members of these groups (unix socket
  // peer credentials), TLS clients whose certificate has one of these
  // common names.
  std::vector<uint32_t> operator_uids;
  std::vector<uint32_t> operator_gids;
  std::vector<std::string> operator_cert_names;
  // Limits (docs/security.md); every one must be positive.
  int64_t max_sessions = 1024;
  int64_t max_namespaces = 256;
  int64_t max_streams_per_session = 64;
  int64_t max_items_per_request = 4096;
  int64_t max_pages_per_request = int64_t{1} << 20;
  int64_t max_tokens_per_request = int64_t{1} << 24;
  int64_t max_pin_ttl_ms = 3600000;
  int64_t max_message_bytes = int64_t{64} << 20;
  int64_t max_connections = 1024;
  int64_t max_rpc_threads = 512;
  int64_t max_stream_backlog = 65536;

  // OK, or INVALID_ARGUMENT naming the offending field and value.
  absl::Status Validate() const;

  // served_ranks, or 0..cp_size-1 when it is empty.
  std::vector<uint32_t> EffectiveRanks() const;

  // Logical device pages over all lanes: device_pages_per_rank * cp_size.
  uint64_t LogicalDevicePages() const {
    return device_pages_per_rank * cp_size;
  }
};

}  // namespace hicache
