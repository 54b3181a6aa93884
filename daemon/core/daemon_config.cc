#include "daemon/core/daemon_config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace hicache {
namespace {

bool IsPowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

bool IsInstanceChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '-';
}

}  // namespace

bool IsValidInstanceId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxInstanceIdLength) return false;
  if (!absl::ascii_isalpha(static_cast<unsigned char>(id[0]))) return false;
  return std::all_of(id.begin(), id.end(), IsInstanceChar);
}

std::string DefaultInstanceId(absl::string_view canonical_socket_path) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a, 64 bits.
  for (char c : canonical_socket_path) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  absl::string_view name = canonical_socket_path;
  if (const size_t slash = name.rfind('/'); slash != absl::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  absl::ConsumeSuffix(&name, ".sock");
  std::string stem;
  for (char c : name.substr(0, 24)) stem.push_back(IsInstanceChar(c) ? c : '_');
  if (stem.empty() || !absl::ascii_isalpha(static_cast<unsigned char>(stem[0]))) {
    stem.insert(0, "hicached");
  }
  // 12 hex digits (48 bits): collisions need ~16 million sockets per host.
  return absl::StrCat(stem, "-",
                      absl::Hex(hash >> 16, absl::PadSpec::kZeroPad12));
}

absl::string_view BackendName(BackendKind backend) {
  switch (backend) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<BackendKind> ParseBackend(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "cpu") return BackendKind::kCpu;
  if (lower == "cuda") return BackendKind::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", text, "'; expected 'cpu' or 'cuda'"));
}

absl::string_view HostLayoutName(HostLayout layout) {
  switch (layout) {
    case HostLayout::kLayerFirst:
      return "layer_first";
    case HostLayout::kPageFirst:
      return "page_first";
  }
  return "unknown";
}

absl::StatusOr<HostLayout> ParseHostLayout(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "layer_first") return HostLayout::kLayerFirst;
  if (lower == "page_first") return HostLayout::kPageFirst;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown host layout '", text,
                   "'; expected 'layer_first' or 'page_first'"));
}

bool AbslParseFlag(absl::string_view text, BackendKind* backend,
                   std::string* error) {
  absl::StatusOr<BackendKind> parsed = ParseBackend(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *backend = *parsed;
  return true;
}

std::string AbslUnparseFlag(BackendKind backend) {
  return std::string(BackendName(backend));
}

bool AbslParseFlag(absl::string_view text, HostLayout* layout,
                   std::string* error) {
  absl::StatusOr<HostLayout> parsed = ParseHostLayout(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *layout = *parsed;
  return true;
}

std::string AbslUnparseFlag(HostLayout layout) {
  return std::string(HostLayoutName(layout));
}

absl::Status DaemonConfig::Validate() const {
  if (!IsPowerOfTwo(page_size) || page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be a power of two in [1, ", kMaxPageSize,
                     "], got ", page_size));
  }
  if (cp_size == 0 || cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_size must be in [1, ", kMaxCpSize, "], got ", cp_size));
  }
  for (size_t i = 0; i < served_ranks.size(); ++i) {
    if (served_ranks[i] >= cp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("served_ranks[", i, "] = ", served_ranks[i],
                       " is not a rank of cp_size ", cp_size));
    }
    if (i > 0 && served_ranks[i] <= served_ranks[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "served_ranks must be strictly ascending without duplicates, got [",
          absl::StrJoin(served_ranks, ","), "]"));
    }
  }
  if (!gpus.empty() && gpus.size() != EffectiveRanks().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpus lists ", gpus.size(), " devices for ", EffectiveRanks().size(),
        " served ranks; give one device per served rank, in rank order"));
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gpus[", i, "] = ", gpus[i], " is not a device ordinal"));
    }
  }
  if (!gpus.empty() && backend != BackendKind::kCuda) {
    return absl::InvalidArgumentError("gpus needs backend=cuda");
  }
  if (cuda_runtime != "real" && cuda_runtime != "simulated") {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_runtime must be 'real' or 'simulated', got '", cuda_runtime,
        "'"));
  }
  if (backend == BackendKind::kCuda && cuda_runtime == "real" &&
      !pin_host_memory) {
    // The copy kernel reads and writes the host pool directly: on pageable
    // memory that is an illegal address that breaks the CUDA context.
    return absl::InvalidArgumentError(
        "pin_host_memory=false needs cuda_runtime=simulated: the CUDA copy "
        "kernel can only reach pinned host memory");
  }
  if (PolicyName(write_policy.value()) == "unknown" ||
      PolicyName(eviction_policy.value()) == "unknown") {
    return absl::InvalidArgumentError(
        "write_policy or eviction_policy is not a policy");
  }
  if (write_through_threshold < 1) {
    return absl::InvalidArgumentError("write_through_threshold must be >= 1");
  }
  if (load_back_threshold_tokens < 0 || l1_free_room_pages < 0 ||
      l2_free_room_pages < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_back_threshold_tokens (", load_back_threshold_tokens,
        "), l1_free_room_pages (", l1_free_room_pages,
        ") and l2_free_room_pages (", l2_free_room_pages,
        ") must be >= 0"));
  }
  if (l1_free_room_pages >= static_cast<int64_t>(device_pages_per_rank) ||
      l2_free_room_pages > static_cast<int64_t>(host_pages_per_rank)) {
    return absl::InvalidArgumentError(
        "free room must be below the pool size (l1_free_room_pages < "
        "device_pages_per_rank, l2_free_room_pages <= host_pages_per_rank)");
  }
  {
    // Quotas: each valid, one per namespace, guarantees that fit the pools.
    absl::flat_hash_set<std::string> seen;
    int64_t device_guaranteed = 0;
    int64_t host_guaranteed = 0;
    const int64_t device_pages =
        (static_cast<int64_t>(device_pages_per_rank) - 1) * cp_size;
    const int64_t host_pages =
        static_cast<int64_t>(host_pages_per_rank) * cp_size;
    for (const NamespaceQuota& quota : namespace_quotas) {
      if (absl::Status s = ValidateNamespaceQuota(quota); !s.ok()) return s;
      if (!seen.insert(quota.ns).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "namespace '", quota.ns, "' has two quotas"));
      }
      // Each within the pools (so the sums cannot overflow).
      device_guaranteed += std::min(quota.device_guaranteed, device_pages + 1);
      host_guaranteed += std::min(quota.host_guaranteed, host_pages + 1);
    }
    if (device_guaranteed > device_pages || host_guaranteed > host_pages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "namespace guarantees (", device_guaranteed, " device, ",
          host_guaranteed, " host pages) exceed the pools (", device_pages,
          " device, ", host_pages, " host pages)"));
    }
  }
  if (transfer_workers < 1 || transfer_workers > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transfer_workers must be in [1, 64], got ", transfer_workers));
  }
  if (copy_max_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_max_blocks must be >= 0, got ", copy_max_blocks));
  }
  if (device_pages_per_rank < 2 || device_pages_per_rank > kMaxPagesPerRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_pages_per_rank must be in [2, ", kMaxPagesPerRank,
                     "] (one page per rank is reserved for padding), got ",
                     device_pages_per_rank));
  }
  if (host_pages_per_rank > kMaxPagesPerRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_pages_per_rank must be at most ", kMaxPagesPerRank,
                     ", got ", host_pages_per_rank));
  }
  for (const auto& [name, value] :
       std::initializer_list<std::pair<absl::string_view, int64_t>>{
           {"max_sessions", max_sessions},
           {"max_namespaces", max_namespaces},
           {"max_streams_per_session", max_streams_per_session},
           {"max_items_per_request", max_items_per_request},
           {"max_pages_per_request", max_pages_per_request},
           {"max_tokens_per_request", max_tokens_per_request},
           {"max_pin_ttl_ms", max_pin_ttl_ms},
           {"max_message_bytes", max_message_bytes},
           {"max_connections", max_connections},
           {"max_rpc_threads", max_rpc_threads},
           {"max_stream_backlog", max_stream_backlog}}) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be positive, got ", value));
    }
  }
  if (max_message_bytes > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes must be below 2 GiB, got ", max_message_bytes));
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file go together");
  }
  if (!listen_tcp.empty()) {
    const bool tls = !tls_cert_file.empty() && !tls_key_file.empty();
    if (!tls && !insecure_tcp_for_testing) {
      return absl::InvalidArgumentError(absl::StrCat(
          "listen_tcp '", listen_tcp,
          "' needs TLS: give tls_cert_file and tls_key_file (and "
          "tls_client_ca_file for mutual TLS); plain TCP only with "
          "insecure_tcp_for_testing"));
    }
    if (listen_tcp.rfind(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen_tcp must be host:port, got '", listen_tcp, "'"));
    }
  }
  if (kv_preset.empty()) {
    return absl::InvalidArgumentError("kv_preset must not be empty");
  }
  if (!instance.empty() && !IsValidInstanceId(instance)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "instance must be 1 to ", kMaxInstanceIdLength,
        " characters of [A-Za-z0-9_-] starting with a letter, got '",
        instance, "'"));
  }
  if (!metrics_address.empty()) {
    if (absl::Status s = CheckMetricsAddress(metrics_address); !s.ok()) {
      return s;
    }
  }
  if (absl::Status group = cp_group.Validate(); !group.ok()) return group;
  if (cp_group.enabled()) {
    if (cp_size < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cp_group needs cp_size >= 2 (the group splits its ranks across "
          "daemons), got ", cp_size));
    }
    if (cp_group.is_leader() && listen_tcp.empty()) {
      return absl::InvalidArgumentError(
          "a CP group leader (cp_group without cp_group_leader) needs "
          "listen_tcp: its followers join it and schedulers reach it there");
    }
    if (cp_group.is_leader() && !served_ranks.empty() &&
        served_ranks.size() == cp_size) {
      return absl::InvalidArgumentError(
          "a CP group leader that holds every rank leaves none to its "
          "followers: give it ranks, the rest go to followers");
    }
    if (!cp_group.is_leader() && served_ranks.empty()) {
      return absl::InvalidArgumentError(
          "a CP group follower needs ranks: the ranks whose pools it holds");
    }
    if (!state_dir.empty()) {
      return absl::InvalidArgumentError(
          "state_dir does not work with cp_group yet (the host tier of a "
          "multi-daemon CP group does not persist); pass --state_dir= to "
          "turn hot restart off");
    }
  }
  if (!state_dir.empty()) {
    if (state_dir[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "state_dir must be an absolute path, got '", state_dir, "'"));
    }
    if (served_ranks.size() != 0 && served_ranks.size() != cp_size) {
      return absl::InvalidArgumentError(
          "state_dir needs every rank served by this daemon: the host tier of "
          "a multi-daemon CP group does not persist yet");
    }
  }
  if (!storage.dir.empty() && !storage.redis_address.empty()) {
    return absl::InvalidArgumentError(
        "l3_dir and l3_redis are exclusive: one storage tier, local or "
        "shared");
  }
  if (!storage.redis_address.empty() &&
      (cp_group.enabled() ||
       (served_ranks.size() != 0 && served_ranks.size() != cp_size))) {
    return absl::InvalidArgumentError(
        "the storage tier needs every rank served by this daemon: a "
        "multi-daemon CP group has no storage tier yet");
  }
  if (!storage.dir.empty()) {
    if (storage.dir[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "l3_dir must be an absolute path, got '", storage.dir, "'"));
    }
    if (storage.pages_per_rank < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "l3_dir needs l3_pages >= 1 (pages per rank), got ",
          storage.pages_per_rank));
    }
    if (cp_group.enabled() ||
        (served_ranks.size() != 0 && served_ranks.size() != cp_size)) {
      return absl::InvalidArgumentError(
          "the storage tier needs every rank served by this daemon: a "
          "multi-daemon CP group has no storage tier yet");
    }
    if (storage.io != "auto" && storage.io != "io_uring" &&
        storage.io != "threads") {
      return absl::InvalidArgumentError(absl::StrCat(
          "l3_io must be auto, io_uring or threads, got '", storage.io, "'"));
    }
    if (storage.queue_depth < 1 || storage.queue_depth > 4096) {
      return absl::InvalidArgumentError(absl::StrCat(
          "l3_queue_depth must be in [1, 4096], got ", storage.queue_depth));
    }
  }
  if (storage_prefetch_timeout_ms < 0 || storage_prefetch_timeout_ms > 60000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "l3_prefetch_timeout_ms must be in [0, 60000], got ",
        storage_prefetch_timeout_ms));
  }
  if (storage_recompute_ns_per_token < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "l3_recompute_ns_per_token must be >= 0, got ",
        storage_recompute_ns_per_token));
  }
  if (recovery_threads < 1 || recovery_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recovery_threads must be in [1, 64], got ", recovery_threads));
  }
  if (journal_settle_ms < 0 || journal_settle_ms > 10000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "journal_settle_ms must be in [0, 10000], got ", journal_settle_ms));
  }
  if (kv_events.block_size != 0 && page_size % kv_events.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_events_block_size (", kv_events.block_size,
                     ") must divide page_size (", page_size, ")"));
  }
  if (kv_events.buffer_batches < 0 || kv_events.buffer_batches > 10000000 ||
      kv_events.hwm < 0 || kv_events.hwm > INT32_MAX / 4 ||
      kv_events.max_queued_events < 1024 ||
      kv_events.max_queued_events > (int64_t{1} << 30)) {
    // A queue smaller than a burst of events overflows on every burst, and
    // each overflow re-announces the whole cache under the engine's lock.
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_events_buffer must be in [0, 10000000], kv_events_hwm in [0, ",
        INT32_MAX / 4, "] and kv_events_max_queue in [1024, 2^30]; got ",
        kv_events.buffer_batches, ", ", kv_events.hwm, ", ",
        kv_events.max_queued_events));
  }
  if (kv_events.device_medium.empty() || kv_events.host_medium.empty()) {
    return absl::InvalidArgumentError("KV event media must not be empty");
  }
  if (!kv_events.replay_endpoint.empty() && kv_events.endpoint.empty()) {
    return absl::InvalidArgumentError(
        "kv_events_replay_endpoint needs kv_events_endpoint");
  }
  if (default_lease_ms == 0 || default_lease_ms > 86400000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "default_lease_ms must be in [1, 86400000], got ", default_lease_ms));
  }
  return absl::OkStatus();
}

absl::Status CheckMetricsAddress(absl::string_view address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_address '", address, "' ", why,
                     " (want IPV4:PORT or [IPV6]:PORT, e.g. 127.0.0.1:9464)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("has no port");
  absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(),
                   [](char c) { return absl::ascii_isdigit(c); })) {
    return bad("has no decimal port");
  }
  uint32_t number = 0;
  if (!absl::SimpleAtoi(port, &number) || number > 65535) {
    return bad("has a port outside [0, 65535]");
  }
  if (absl::StartsWith(host, "[")) {
    // Debian's civetweb (under prometheus-cpp) is built without IPv6.
    return bad("is IPv6, which the metrics HTTP server does not serve; use "
               "an IPv4 address (0.0.0.0 for every interface)");
  }
  unsigned char parsed[4];
  const std::string literal(host);
  if (inet_pton(AF_INET, literal.c_str(), parsed) != 1) {
    return bad("does not name an IPv4 address");
  }
  return absl::OkStatus();
}

std::vector<uint32_t> DaemonConfig::EffectiveRanks() const {
  if (!served_ranks.empty()) return served_ranks;
  std::vector<uint32_t> ranks(cp_size);
  for (uint32_t r = 0; r < cp_size; ++r) ranks[r] = r;
  return ranks;
}

}  // namespace hicache
