// hicached: the hierarchical KV-cache daemon. See `hicached --help`.
//
// Exit codes: 0 after a clean shutdown on SIGTERM/SIGINT, and for --help and
// --version; 1 when the daemon cannot start or fails while running (socket in
// use, cannot listen, no GPU); 2 for every invalid configuration: an unknown
// flag, a value that does not parse, an unreadable --flagfile, or flags that
// parse but describe an invalid configuration (systemd's
// RestartPreventExitStatus=2: restarting will not help).
//
// Configuration can come from a file: --flagfile=PATH reads one --flag=value
// per line, '#' starts a comment line (absl flags; deploy/ has a commented
// default). Flags on the command line after --flagfile override it.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "client/cpp/endpoint.h"
#include "daemon/core/build_info.h"
#include "daemon/core/check.h"
#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/kv_layout.h"
#include "daemon/core/log_format.h"
#include "daemon/core/log_setup.h"
#include "daemon/core/policies.h"
#include "daemon/main/backend_factory.h"
#include "daemon/main/daemon_server.h"
#include "daemon/main/service_notifier.h"
#include "daemon/group/group_status.h"
#include "daemon/main/static_leader_view.h"
#include "daemon/main/storage_flags.h"
#include "daemon/pool/host_budget.h"
#include "daemon/service/leader_guard.h"
#include "absl/flags/usage_config.h"
#include "spdlog/spdlog.h"
#include "version/version.h"

ABSL_FLAG(std::string, socket, "",
          "Unix socket to listen on (default: $HICACHE_SOCKET if set, else "
          "$XDG_RUNTIME_DIR/hicached.sock, else /tmp/hicached.sock: where "
          "clients look). Created with mode 0660.");
ABSL_FLAG(std::string, instance, "",
          "Shared-memory instance id: pool segments are named "
          "/hicache-<instance>-{device,host}-r<rank>, and segments a killed "
          "daemon of this instance left are reclaimed at start. 1-64 "
          "characters of [A-Za-z0-9_-] starting with a letter (default: the "
          "socket's name plus a hash of its canonical path).");
ABSL_FLAG(hicache::BackendKind, backend, hicache::BackendKind::kCpu,
          "Device backend: 'cpu' (shared memory stands in for GPU memory) or "
          "'cuda'.");
ABSL_FLAG(uint32_t, page_size, 64, "Tokens per KV page (a power of two).");
ABSL_FLAG(uint32_t, cp_size, 1,
          "Context-parallel size: number of owner lanes.");
ABSL_FLAG(std::vector<std::string>, ranks, {},
          "Comma-separated CP ranks whose pools this daemon owns (default: "
          "all ranks 0..cp_size-1).");
ABSL_FLAG(std::vector<std::string>, gpus, {},
          "--backend=cuda: CUDA device of each served rank, in rank order "
          "(default: rank r on device r).");
ABSL_FLAG(std::string, cuda_runtime, "real",
          "--backend=cuda: 'real' (the CUDA runtime) or 'simulated' (a CPU "
          "simulation of it, for tests and demos without a GPU).");
ABSL_FLAG(int32_t, copy_max_blocks, 0,
          "--backend=cuda: thread blocks per copy launch (0: the kernel's "
          "default); bounds the SMs copies take from compute.");
ABSL_FLAG(bool, lock_host_memory, false,
          "CPU backend: mlock the host pools (needs RLIMIT_MEMLOCK).");
ABSL_FLAG(bool, pin_host_memory, true,
          "CUDA backend: pin the host pools with cudaHostRegister (the copy "
          "kernel reads and writes them directly).");
ABSL_FLAG(uint32_t, write_through_threshold, 2,
          "Hits before a node is written through "
          "(--write_policy=write_through_selective).");
ABSL_FLAG(int64_t, load_back_threshold_tokens, 0,
          "Host hits shorter than this are misses (not worth a load).");
ABSL_FLAG(int64_t, l1_free_room_pages, 0,
          "After device pressure, evict until this many pages are free per "
          "lane.");
ABSL_FLAG(int64_t, l2_free_room_pages, 0,
          "After host pressure, evict until this many pages are free per "
          "rank.");
ABSL_FLAG(std::string, namespace_quotas, "",
          "Per-namespace page quotas at start, ';'-separated entries "
          "NS:KEY=PAGES[,KEY=PAGES...] with keys device_limit, "
          "device_guaranteed, host_limit and host_guaranteed (logical "
          "pages over all lanes; docs/quotas.md). hicachectl quota set "
          "changes them at run time.");
ABSL_FLAG(int32_t, transfer_workers, 2, "CPU backend: memcpy threads.");
ABSL_FLAG(uint64_t, device_pages_per_rank, 4096,
          "Physical device (L1) pages in each rank's lane.");
// Optional flags: giving both is refused, so each must know if it was given.
ABSL_FLAG(std::optional<uint64_t>, host_pages_per_rank, std::nullopt,
          "Physical host (L2) pages for each rank (default 16384). Each page "
          "holds the target and the draft KV of its tokens. Not with "
          "--host_bytes_per_rank.");
ABSL_FLAG(std::optional<uint64_t>, host_bytes_per_rank, std::nullopt,
          "Host (L2) memory for each rank, in bytes, instead of "
          "--host_pages_per_rank: one budget the target and draft KV share "
          "(as many pages as fit, each holding both payloads of its tokens; "
          "the start-up log prints the split).");
ABSL_FLAG(hicache::HostLayout, host_layout, hicache::HostLayout::kLayerFirst,
          "Host pool byte order: 'layer_first' or 'page_first'.");
ABSL_FLAG(std::optional<std::string>, kv_preset, std::nullopt,
          "KV layout preset (default tiny): deepseek-v3.2, deepseek-v3.2-fp8, "
          "llama-3-8b, llama-3-70b, qwen3-8b, qwen3-32b, qwen3-30b-a3b, "
          "qwen3-235b-a22b, glm-4-9b, glm-4.5, mistral-7b (one worker's bf16 "
          "K and V at TP 1), micro, tiny or tiny-draft. Not with "
          "--kv_layout_file.");
ABSL_FLAG(std::string, kv_layout_file, "",
          "A JSON file describing the KV layout (docs/kv-layouts.md): a name "
          "and either 'attention' (layers, kv_heads, head_dim, dtype, "
          "tp_size) or row-by-row 'families'. For models, dtypes or tensor "
          "parallelism the presets do not cover. Not with --kv_preset.");
ABSL_FLAG(hicache::EvictionPolicy, eviction_policy,
          hicache::EvictionPolicy::kTinyLfu,
          "Eviction order: lru, lfu, fifo, priority, slru or tinylfu. "
          "tinylfu (default): the device tier is an LRU window; the host "
          "tier evicts the learned unshared ends of requests first, then the "
          "least recently used, a node a frequency sketch saw again counting "
          "as two cache turnovers younger; a cold device node is copied to "
          "the host only if it would not displace a more frequent host node. "
          "Mooncake trace, L1 6000 + L2 12000 blocks, "
          "write_ahead: tinylfu 57.35% L1+L2 hits (89.7% of the offline "
          "bound), lru 52.8% (docs/eviction.md).");
ABSL_FLAG(hicache::WritePolicy, write_policy,
          hicache::WritePolicy::kWriteAhead,
          "When device KV is copied to the host tier: write_ahead (default: "
          "a request's new pages are written through per layer while its "
          "forward runs when their prefix has a host copy and the host tier "
          "has free room for them, and the cold end "
          "of the device tier is copied in the background before room is "
          "needed, so no allocation or load waits for a copy and a victim "
          "without one is dropped; the host tier is prefix-closed, so a "
          "restart recovers all of it; 57.35% on the trace above), "
          "write_through (every new node, at once; the tiers overlap: 48.8% "
          "with tinylfu), write_through_selective (at the --write_through_"
          "threshold-th hit) or write_back (when evicted from device; "
          "exclusive tiers, 58.2% with tinylfu, but an allocation may wait "
          "for a victim's copy, and a crash loses the host copies whose "
          "prefix was only on the device).");
ABSL_FLAG(uint32_t, default_lease_ms, 10000,
          "Session lease for clients that ask for none.");
ABSL_FLAG(std::string, listen_tcp, "",
          "Also listen on TCP host:port. Requires --tls_cert_file and "
          "--tls_key_file unless --insecure_tcp_for_testing.");
ABSL_FLAG(std::string, tls_cert_file, "", "PEM server certificate for TCP.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM server private key for TCP.");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "PEM CA bundle: require and verify client certificates (mTLS).");
ABSL_FLAG(bool, insecure_tcp_for_testing, false,
          "Allow --listen_tcp without TLS. Never in production.");
ABSL_FLAG(bool, paranoid_checks, false,
          "After every lease expiry (a client that died), check the cache's "
          "invariants (tree, tiers, pools, page ownership; O(cached nodes)) "
          "and log the result: 'invariants hold' or an error. For tests "
          "and debugging, not production.");
// CP groups of several daemons (docs/cp-groups.md).
ABSL_FLAG(std::string, cp_group, "",
          "Serve one CP group together with other hicached daemons, each "
          "holding the pools of its --ranks: the group's name. Without "
          "--cp_group_leader this daemon leads: it keeps the radix tree and "
          "every rank's page metadata, needs --listen_tcp, and its followers "
          "and schedulers reach it there. Empty (default): this daemon serves "
          "every rank of its CP group itself.");
ABSL_FLAG(std::string, cp_group_leader, "",
          "--cp_group follower: the leader's gRPC host:port. The follower "
          "holds its --ranks' pools and serves its workers; schedulers' tree "
          "RPCs are redirected to the leader. Losing the leader exits 1.");
ABSL_FLAG(std::string, cp_group_advertise, "",
          "--cp_group leader: the host:port redirects name (default: "
          "--listen_tcp with its bound port).");
ABSL_FLAG(std::string, cp_group_bind, "127.0.0.1",
          "--cp_group: the IP address (or interface) the group's links "
          "listen on (Gloo TCP; ports chosen by the OS).");
ABSL_FLAG(std::string, cp_group_member, "",
          "--cp_group: this daemon's name in the group (default: its "
          "--instance).");
ABSL_FLAG(uint32_t, cp_group_heartbeat_ms, 100,
          "--cp_group: heartbeat interval on each link.");
ABSL_FLAG(uint32_t, cp_group_timeout_ms, 1000,
          "--cp_group: a peer silent this long is lost (leader: its ranks "
          "become unavailable; follower: exit 1).");
ABSL_FLAG(uint32_t, cp_group_join_timeout_ms, 60000,
          "--cp_group follower: how long to keep trying to join the leader "
          "before exiting 1.");
ABSL_FLAG(uint32_t, cp_group_step_timeout_ms, 10000,
          "--cp_group leader: a member that leaves a copy step unanswered "
          "this long is declared lost (0: no deadline).");
ABSL_FLAG(uint32_t, cp_group_digest_interval_ms, 1000,
          "--cp_group leader: how often each member's copy accounting is "
          "checked against the leader's (0: never).");
ABSL_FLAG(std::string, cp_group_test_non_leader_of, "",
          "TEST ONLY, with --insecure_tcp_for_testing: act as a CP group "
          "follower whose leader is this host:port target: the tree RPCs "
          "are refused with a redirect there (docs/api.md, \"CP group "
          "leader redirect\"). No group is formed.");
ABSL_FLAG(std::string, metrics_address, "",
          "Serve Prometheus metrics over plain HTTP at IPV4:PORT "
          "(GET /metrics; port 0 picks one, logged at start), "
          "e.g. 127.0.0.1:9464. Empty (default): no metrics endpoint. See "
          "docs/metrics.md.");
ABSL_FLAG(std::string, state_dir, "",
          "Hot restart (docs/hot-restart.md): a directory (absolute path, "
          "created 0700) for the host tier's journal. The host pools then "
          "outlive the daemon, and a restart of the same instance and "
          "geometry (after SIGKILL, SIGTERM or an upgrade) recovers the host "
          "tier, every page verified against its checksum before it is "
          "served. Empty (default): the host tier dies with the daemon.");
ABSL_FLAG(int32_t, recovery_threads, 2,
          "--state_dir: threads verifying host pages at start.");
ABSL_FLAG(int32_t, journal_settle_ms, 20,
          "--state_dir: how long a committed backup waits before it is "
          "journaled (0..10000). One evicted within it costs no checksums "
          "and no record; a crash loses about this long of commits (their "
          "pages are free after the restart).");
// KV events for cluster routers (docs/kv-events.md).
ABSL_FLAG(std::string, kv_events_endpoint, "",
          "Publish KV events (which blocks each tier holds) in vLLM's ZMQ "
          "format (msgpack KVEventBatch; vLLM 0.33) on this PUB endpoint, "
          "for llm-d's KV-cache indexer, Dynamo's KV router and similar "
          "routers. Bound when it holds '*' or is ipc:// (e.g. tcp://*:5557 "
          "or ipc:///run/hicached/kv-events), connected otherwise. The events "
          "carry token ids of every namespace: bind it where only routers "
          "reach. Empty (default): no events.");
ABSL_FLAG(std::string, kv_events_replay_endpoint, "",
          "With --kv_events_endpoint: a ROUTER endpoint (bound) answering "
          "replay requests from a sequence number (vLLM's protocol). Empty "
          "(default): no replay.");
ABSL_FLAG(std::string, kv_events_topic, "kv@{instance}@{model}",
          "Each namespace's event topic, from {instance}, {model} and "
          "{namespace}; must name {model} or {namespace}. A scheduler "
          "declares its instance and model at OpenSession; otherwise "
          "--kv_events_instance and --kv_events_model (or the namespace).");
ABSL_FLAG(std::string, kv_events_instance, "",
          "Default {instance} of the event topics. Empty: the host name.");
ABSL_FLAG(std::string, kv_events_model, "",
          "Default {model} of the event topics. Empty: the namespace "
          "(\"default\" for the default namespace).");
ABSL_FLAG(uint32_t, kv_events_block_size, 0,
          "Tokens per announced block: the router's block size, a divisor of "
          "--page_size. 0 (default): the page size.");
ABSL_FLAG(uint64_t, kv_events_hash_seed, 0,
          "Seed of the block hashes (XXH3-64 chained over the namespace and "
          "the tokens; docs/kv-events.md).");
ABSL_FLAG(std::string, kv_events_device_medium, "GPU",
          "The medium of device-tier events (vLLM's MEDIUM_GPU).");
ABSL_FLAG(std::string, kv_events_host_medium, "CPU",
          "The medium of host-tier events (vLLM's MEDIUM_CPU; SGLang uses "
          "CPU_PINNED).");
ABSL_FLAG(int64_t, kv_events_dp_rank, 0,
          "The data_parallel_rank every event batch carries.");
ABSL_FLAG(int64_t, kv_events_buffer, 10000,
          "Event batches kept for replay.");
ABSL_FLAG(int64_t, kv_events_hwm, 100000,
          "High-water mark of the PUB socket (messages per subscriber).");
ABSL_FLAG(int64_t, kv_events_max_queue, 100000,
          "Events waiting to be published at most (1024 .. 2^30); past it "
          "they are dropped and every topic is cleared and announced again "
          "(a walk of the whole cache under the engine's lock).");
ABSL_FLAG(std::string, log_level, "info",
          "Log level: trace, debug, info, warn, error, critical or off.");
ABSL_FLAG(hicache::LogFormat, log_format, hicache::LogFormat::kText,
          "Log lines on stderr: 'text' (2026-12-01T09:43:43.123Z info [tid] "
          "message) or 'json' (one object per line: ts, level, logger, "
          "thread, msg). Timestamps are UTC either way.");
ABSL_FLAG(double, shutdown_grace_seconds, 5,
          "On SIGTERM/SIGINT, how long running RPCs may finish before they "
          "are cancelled.");
// Roles and limits (docs/security.md).
ABSL_FLAG(std::vector<std::string>, operator_uids, {},
          "Uids (besides root) whose unix-socket connections are operators.");
ABSL_FLAG(std::vector<std::string>, operator_gids, {},
          "Groups whose members' unix-socket connections are operators.");
ABSL_FLAG(std::vector<std::string>, operator_cert_names, {},
          "TLS client certificate common names that are operators.");
ABSL_FLAG(int64_t, max_sessions, 1024, "Open sessions at most.");
ABSL_FLAG(int64_t, max_namespaces, 256,
          "Distinct namespaces among open sessions at most.");
ABSL_FLAG(int64_t, max_streams_per_session, 64,
          "Concurrent BackupSession/LoadBack streams of one session.");
ABSL_FLAG(int64_t, max_items_per_request, 4096,
          "Items (requests, nodes, specs) in one call.");
ABSL_FLAG(int64_t, max_pages_per_request, int64_t{1} << 20,
          "Device pages named or requested by one call.");
ABSL_FLAG(int64_t, max_tokens_per_request, int64_t{1} << 24,
          "Tokens carried by one call, all items together.");
ABSL_FLAG(int64_t, max_pin_ttl_ms, 3600000, "Longest pin a client may ask.");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20,
          "Largest gRPC message received.");
ABSL_FLAG(int64_t, max_connections, 1024,
          "Open connections at most, per listener (the unix socket and the "
          "TCP one); more are closed at once.");
ABSL_FLAG(int64_t, max_rpc_threads, 512,
          "RPCs served at once (gRPC resource quota); more get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_stream_backlog, 65536,
          "Events waiting for a slow stream reader before the stream is cut "
          "off and its operations rolled back.");

namespace hicache {
namespace {

constexpr int kExitRuntimeError = 1;
constexpr int kExitBadConfig = 2;

absl::StatusOr<DaemonConfig> ConfigFromFlags() {
  DaemonConfig config;
  config.backend = absl::GetFlag(FLAGS_backend);
  config.page_size = absl::GetFlag(FLAGS_page_size);
  config.cp_size = absl::GetFlag(FLAGS_cp_size);
  for (const std::string& text : absl::GetFlag(FLAGS_ranks)) {
    uint32_t rank = 0;
    if (!absl::SimpleAtoi(text, &rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ranks: '", text, "' is not a rank number"));
    }
    config.served_ranks.push_back(rank);
  }
  for (const std::string& text : absl::GetFlag(FLAGS_gpus)) {
    int32_t device = 0;
    if (!absl::SimpleAtoi(text, &device)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus: '", text, "' is not a device number"));
    }
    config.gpus.push_back(device);
  }
  config.cuda_runtime = absl::GetFlag(FLAGS_cuda_runtime);
  config.write_through_threshold = absl::GetFlag(FLAGS_write_through_threshold);
  config.load_back_threshold_tokens =
      absl::GetFlag(FLAGS_load_back_threshold_tokens);
  config.l1_free_room_pages = absl::GetFlag(FLAGS_l1_free_room_pages);
  config.l2_free_room_pages = absl::GetFlag(FLAGS_l2_free_room_pages);
  for (absl::string_view entry :
       absl::StrSplit(absl::GetFlag(FLAGS_namespace_quotas), ';',
                      absl::SkipWhitespace())) {
    absl::StatusOr<NamespaceQuota> quota =
        ParseNamespaceQuota(absl::StripAsciiWhitespace(entry));
    if (!quota.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--namespace_quotas: ", quota.status().message()));
    }
    config.namespace_quotas.push_back(*std::move(quota));
  }
  config.transfer_workers = absl::GetFlag(FLAGS_transfer_workers);
  config.copy_max_blocks = absl::GetFlag(FLAGS_copy_max_blocks);
  config.lock_host_memory = absl::GetFlag(FLAGS_lock_host_memory);
  config.pin_host_memory = absl::GetFlag(FLAGS_pin_host_memory);
  config.device_pages_per_rank = absl::GetFlag(FLAGS_device_pages_per_rank);
  const std::optional<uint64_t> host_pages =
      absl::GetFlag(FLAGS_host_pages_per_rank);
  const std::optional<uint64_t> host_bytes =
      absl::GetFlag(FLAGS_host_bytes_per_rank);
  if (host_pages.has_value() && host_bytes.has_value()) {
    return absl::InvalidArgumentError(
        "--host_pages_per_rank and --host_bytes_per_rank both size the host "
        "tier; give one of them");
  }
  if (host_pages.has_value()) config.host_pages_per_rank = *host_pages;
  if (host_bytes.has_value()) {
    if (*host_bytes == 0) {
      return absl::InvalidArgumentError("--host_bytes_per_rank must be > 0");
    }
    config.host_bytes_per_rank = *host_bytes;
  }
  config.host_layout = absl::GetFlag(FLAGS_host_layout);
  const std::optional<std::string> kv_preset = absl::GetFlag(FLAGS_kv_preset);
  config.kv_layout_file = absl::GetFlag(FLAGS_kv_layout_file);
  if (!config.kv_layout_file.empty()) {
    if (kv_preset.has_value()) {
      return absl::InvalidArgumentError(
          "--kv_preset and --kv_layout_file both name the KV layout; give one "
          "of them (a flagfile may set --kv_preset)");
    }
    absl::StatusOr<KvLayout> layout = ReadKvLayoutFile(config.kv_layout_file);
    if (!layout.ok()) return layout.status();
    config.kv_preset = layout->name;
    config.kv_families = std::move(layout->families);
  } else if (kv_preset.has_value()) {
    config.kv_preset = *kv_preset;
  }
  config.default_lease_ms = absl::GetFlag(FLAGS_default_lease_ms);
  config.eviction_policy = absl::GetFlag(FLAGS_eviction_policy);
  config.write_policy = absl::GetFlag(FLAGS_write_policy);
  config.listen_tcp = absl::GetFlag(FLAGS_listen_tcp);
  config.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  config.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  config.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file);
  config.insecure_tcp_for_testing =
      absl::GetFlag(FLAGS_insecure_tcp_for_testing);
  config.paranoid_checks = absl::GetFlag(FLAGS_paranoid_checks);
  config.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  for (const auto& [flag, out] :
       {std::pair{absl::GetFlag(FLAGS_operator_uids), &config.operator_uids},
        std::pair{absl::GetFlag(FLAGS_operator_gids),
                  &config.operator_gids}}) {
    for (const std::string& text : flag) {
      uint32_t id = 0;
      if (!absl::SimpleAtoi(text, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--operator_uids/--operator_gids: '", text,
                         "' is not a numeric id"));
      }
      out->push_back(id);
    }
  }
  config.operator_cert_names = absl::GetFlag(FLAGS_operator_cert_names);
  config.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  config.max_namespaces = absl::GetFlag(FLAGS_max_namespaces);
  config.max_streams_per_session = absl::GetFlag(FLAGS_max_streams_per_session);
  config.max_items_per_request = absl::GetFlag(FLAGS_max_items_per_request);
  config.max_pages_per_request = absl::GetFlag(FLAGS_max_pages_per_request);
  config.max_tokens_per_request = absl::GetFlag(FLAGS_max_tokens_per_request);
  config.max_pin_ttl_ms = absl::GetFlag(FLAGS_max_pin_ttl_ms);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.max_connections = absl::GetFlag(FLAGS_max_connections);
  config.max_rpc_threads = absl::GetFlag(FLAGS_max_rpc_threads);
  config.max_stream_backlog = absl::GetFlag(FLAGS_max_stream_backlog);
  config.instance = absl::GetFlag(FLAGS_instance);
  config.state_dir = absl::GetFlag(FLAGS_state_dir);
  config.recovery_threads = absl::GetFlag(FLAGS_recovery_threads);
  config.journal_settle_ms = absl::GetFlag(FLAGS_journal_settle_ms);
  StorageConfigFromFlags(&config);
  config.kv_events.endpoint = absl::GetFlag(FLAGS_kv_events_endpoint);
  config.kv_events.replay_endpoint =
      absl::GetFlag(FLAGS_kv_events_replay_endpoint);
  config.kv_events.topic = absl::GetFlag(FLAGS_kv_events_topic);
  config.kv_events.instance = absl::GetFlag(FLAGS_kv_events_instance);
  config.kv_events.model = absl::GetFlag(FLAGS_kv_events_model);
  config.kv_events.block_size = absl::GetFlag(FLAGS_kv_events_block_size);
  config.kv_events.hash_seed = absl::GetFlag(FLAGS_kv_events_hash_seed);
  config.kv_events.device_medium =
      absl::GetFlag(FLAGS_kv_events_device_medium);
  config.kv_events.host_medium = absl::GetFlag(FLAGS_kv_events_host_medium);
  config.kv_events.data_parallel_rank =
      absl::GetFlag(FLAGS_kv_events_dp_rank);
  config.kv_events.buffer_batches = absl::GetFlag(FLAGS_kv_events_buffer);
  config.kv_events.hwm = absl::GetFlag(FLAGS_kv_events_hwm);
  config.kv_events.max_queued_events =
      absl::GetFlag(FLAGS_kv_events_max_queue);
  config.cp_group.name = absl::GetFlag(FLAGS_cp_group);
  config.cp_group.leader = absl::GetFlag(FLAGS_cp_group_leader);
  config.cp_group.advertise = absl::GetFlag(FLAGS_cp_group_advertise);
  config.cp_group.bind = absl::GetFlag(FLAGS_cp_group_bind);
  config.cp_group.member = absl::GetFlag(FLAGS_cp_group_member);
  config.cp_group.heartbeat_ms = absl::GetFlag(FLAGS_cp_group_heartbeat_ms);
  config.cp_group.timeout_ms = absl::GetFlag(FLAGS_cp_group_timeout_ms);
  config.cp_group.join_timeout_ms =
      absl::GetFlag(FLAGS_cp_group_join_timeout_ms);
  config.cp_group.step_timeout_ms =
      absl::GetFlag(FLAGS_cp_group_step_timeout_ms);
  config.cp_group.digest_interval_ms =
      absl::GetFlag(FLAGS_cp_group_digest_interval_ms);
  // The host tier's pages (from --host_bytes_per_rank when given), then
  // every field, derived ones included.
  if (absl::StatusOr<HostBudget> host = ResolveHostPages(&config); !host.ok()) {
    return host.status();
  }
  if (absl::Status valid = config.Validate(); !valid.ok()) return valid;
  // A CUDA backend that cannot run here is a configuration error (exit 2),
  // found before anything is created.
  if (absl::Status available = CheckBackendAvailable(config); !available.ok()) {
    return available;
  }
  return config;
}

// absl's flag parser calls exit(1) on an unknown flag, a bad value or an
// unreadable --flagfile, and exits by itself after --help and --version. While
// it runs, this exit handler turns those exits into ours: 2 for an invalid
// configuration, 0 for help and version (which print, then exit).
enum class ParsePhase { kNotParsing, kParsing, kUsage };
std::atomic<ParsePhase> parse_phase{ParsePhase::kNotParsing};

void ExitCodeForFlagParsing() {
  switch (parse_phase.load()) {
    case ParsePhase::kNotParsing:
      return;
    case ParsePhase::kParsing:
      std::fflush(nullptr);
      std::_Exit(kExitBadConfig);
    case ParsePhase::kUsage:
      std::fflush(nullptr);
      std::_Exit(0);
  }
}

bool IsUsageFlag(absl::string_view arg) {
  for (absl::string_view name :
       {"help", "helpfull", "helpshort", "helppackage", "version",
        "only_check_args"}) {
    for (absl::string_view dashes : {"-", "--"}) {
      if (arg == absl::StrCat(dashes, name)) return true;
    }
  }
  return absl::StartsWith(arg, "--helpon=") ||
         absl::StartsWith(arg, "--helpmatch=") ||
         absl::StartsWith(arg, "-helpon=") ||
         absl::StartsWith(arg, "-helpmatch=");
}

// Parses the command line (and any --flagfile); returns only when every flag
// parsed and no usage flag was given.
void ParseFlags(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.version_string = [] {
    return absl::StrCat("hicached ", VersionString(), "\n");
  };
  absl::SetFlagsUsageConfig(usage);
  ParsePhase phase = ParsePhase::kParsing;
  for (int i = 1; i < argc; ++i) {
    if (absl::string_view(argv[i]) == "--") break;
    if (IsUsageFlag(argv[i])) phase = ParsePhase::kUsage;
  }
  std::atexit(ExitCodeForFlagParsing);
  parse_phase = phase;
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  parse_phase = ParsePhase::kNotParsing;
  if (positional.size() > 1) {
    std::fprintf(stderr,
                 "ERROR: unexpected argument '%s' (hicached takes only "
                 "flags; see --help)\n",
                 positional[1]);
    std::exit(kExitBadConfig);
  }
}

int Run(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "hicached: hierarchical KV-cache daemon (device L1 + pinned host L2).\n"
      "Usage: hicached [--flagfile=PATH] [--socket=PATH] [--backend=cpu] "
      "[--cp_size=N] ...\n"
      "--flagfile reads --flag=value lines ('#' comments); later flags "
      "override it.\n"
      "Exit codes: 0 clean shutdown (and --help, --version), 1 start-up or "
      "runtime failure, 2 invalid configuration (unknown flag, bad value, "
      "unreadable flagfile, inconsistent settings).");
  ParseFlags(argc, argv);

  const LogOptions log_options{.level = absl::GetFlag(FLAGS_log_level),
                               .format = absl::GetFlag(FLAGS_log_format)};
  if (absl::Status logging = ConfigureLogging(log_options); !logging.ok()) {
    // Say why in the chosen format, at the default level.
    const absl::Status fallback = ConfigureLogging({.format = log_options.format});
    HICACHE_CHECK(fallback.ok(), "the default log level is valid");
    spdlog::error("invalid configuration: {}", logging.message());
    return kExitBadConfig;
  }
  absl::StatusOr<DaemonConfig> config = ConfigFromFlags();
  if (!config.ok()) {
    spdlog::error("invalid configuration: {}", config.status().message());
    return kExitBadConfig;
  }
  std::string socket_path = absl::GetFlag(FLAGS_socket);
  if (socket_path.empty()) {
    const char* env = std::getenv("HICACHE_SOCKET");
    socket_path = env != nullptr && env[0] != '\0' ? std::string(env)
                                                     : client::DefaultSocketPath();
  }

  // Block the shutdown signals before gRPC starts threads, so that only the
  // dedicated waiter below ever receives them.
  sigset_t shutdown_signals;
  sigemptyset(&shutdown_signals);
  sigaddset(&shutdown_signals, SIGTERM);
  sigaddset(&shutdown_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &shutdown_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<LeaderView> leader_view;
  std::function<std::optional<group::GroupStatus>()> group_status;
  if (const std::string non_leader_of =
          absl::GetFlag(FLAGS_cp_group_test_non_leader_of);
      !non_leader_of.empty()) {
    if (config->cp_group.enabled()) {
      spdlog::error(
          "invalid configuration: --cp_group_test_non_leader_of and "
          "--cp_group cannot be combined");
      return kExitBadConfig;
    }
    if (!config->insecure_tcp_for_testing) {
      spdlog::error(
          "invalid configuration: --cp_group_test_non_leader_of is for tests "
          "only and needs --insecure_tcp_for_testing");
      return kExitBadConfig;
    }
    if (!service::IsValidLeaderTarget(non_leader_of)) {
      spdlog::error(
          "invalid configuration: --cp_group_test_non_leader_of must be a "
          "host:port target");
      return kExitBadConfig;
    }
    spdlog::warn("TEST ONLY: acting as a CP group follower of {}",
                 non_leader_of);
    leader_view = std::make_unique<StaticLeaderView>(false, non_leader_of);
    // A follower that never joined: forming, the leader not heard from.
    group::GroupStatus status{.role = group::GroupRole::kFollower,
                              .state = group::GroupState::kForming,
                              .cp_size = config->cp_size};
    status.members.push_back(group::GroupMemberStatus{
        .index = 0, .name = non_leader_of, .live = false});
    group_status = [status]() -> std::optional<group::GroupStatus> {
      return status;
    };
  }

  absl::StatusOr<std::unique_ptr<DaemonServer>> server = DaemonServer::Start(
      *config, socket_path, Clock::Real(), std::move(leader_view),
      std::move(group_status));
  if (!server.ok()) {
    // The checks that need the machine (a socket path that cannot be a unix
    // socket, a preset the geometry rejects, an instance name) report
    // INVALID_ARGUMENT: configuration, not circumstance.
    if (absl::IsInvalidArgument(server.status())) {
      spdlog::error("invalid configuration: {}", server.status().message());
      return kExitBadConfig;
    }
    spdlog::error("cannot start: {}", server.status().message());
    return kExitRuntimeError;
  }
  if ((*server)->socket().removed_stale_socket()) {
    spdlog::warn("removed stale socket {} left by a daemon that is gone",
                 socket_path);
  }
  const BuildInfo& build = GetBuildInfo();
  spdlog::info(
      "hicached {} ({}, {}, {}) serving on {}{}: backend={} page_size={} cp_size={} "
      "ranks=[{}] device_pages_per_rank={} host_pages_per_rank={} "
      "host_layout={} write_policy={} eviction_policy={}",
      build.version, build.git_revision, build.compiler, build.build_mode,
      (*server)->listen_address(),
      (*server)->tcp_port() == 0
          ? std::string()
          : absl::StrCat(" and TCP port ", (*server)->tcp_port()),
      BackendName(config->backend),
      config->page_size, config->cp_size,
      absl::StrJoin(config->EffectiveRanks(), ","),
      config->device_pages_per_rank, config->host_pages_per_rank,
      HostLayoutName(config->host_layout), config->write_policy.name(),
      config->eviction_policy.name());
  NotifyServiceManager("READY=1");

  const absl::Duration grace =
      absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  DaemonServer* daemon = server->get();
  std::atomic<bool> stopped_by_failure{false};
  std::thread signal_waiter([&shutdown_signals, &stopped_by_failure, daemon,
                             grace] {
    int signal_number = 0;
    sigwait(&shutdown_signals, &signal_number);
    if (stopped_by_failure) return;
    spdlog::info("received {}, shutting down (grace {})",
                 strsignal(signal_number), absl::FormatDuration(grace));
    NotifyServiceManager("STOPPING=1");
    daemon->Shutdown(grace);
  });
  (*server)->Wait();
  const absl::Status failure = (*server)->failure();
  if (!failure.ok()) {
    // The daemon stopped by itself; wake the waiter, which then finds the
    // server already shut down.
    stopped_by_failure = true;
    pthread_kill(signal_waiter.native_handle(), SIGTERM);
  }
  signal_waiter.join();
  server->reset();
  if (!failure.ok()) {
    spdlog::error("hicached stopped: {}", std::string(failure.message()));
    return kExitRuntimeError;
  }
  spdlog::info("hicached stopped");
  return 0;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) { return hicache::Run(argc, argv); }
