#include "bench/replay_lib.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/percentile.h"
#include "absl/strings/str_cat.h"

#include "daemon/core/daemon_config.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/shm_segments.h"
#include "daemon/events/kv_event_options.h"
#include "daemon/storage/file_page_store.h"
#include "daemon/events/kv_event_publisher.h"
#include "daemon/transfer/faulty_transfer_engine.h"

namespace hicache {
namespace {

absl::StatusOr<ReplayOutcome> ReplayWith(const std::vector<TraceRequest>& trace,
                                         const ReplayConfig& config,
                                         EngineOptions options,
                                         events::KvEventPublisher* events);

// CPU seconds the calling thread has used.
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

}  // namespace

absl::StatusOr<ReplayOutcome> ReplayTrace(
    const std::vector<TraceRequest>& trace, const ReplayConfig& config) {
  const int64_t block = config.block_tokens;
  const uint32_t page = config.page_size;
  if (block <= 0 || block % page != 0) {
    return absl::InvalidArgumentError(
        "block_tokens must be a positive multiple of the page size");
  }
  const int64_t pages_per_block = block / page;
  // The daemon's configuration of this replay, converted as hicached does.
  DaemonConfig daemon;
  daemon.page_size = page;
  daemon.cp_size = 1;
  daemon.kv_preset = config.kv_preset;
  daemon.device_pages_per_rank = 1 + config.l1_blocks * pages_per_block;
  daemon.host_pages_per_rank = config.l2_blocks * pages_per_block;
  daemon.write_policy = config.write_policy;
  daemon.write_through_threshold = config.write_through_threshold;
  daemon.eviction_policy = config.eviction_policy;
  daemon.transfer_workers = 1;
  daemon.namespace_quotas = config.namespace_quotas;
  if (absl::Status valid = daemon.Validate(); !valid.ok()) return valid;
  EngineOptions options = EngineOptionsFrom(daemon);
  // The storage tier's cost model weighs the measured read time: off in
  // deterministic mode, whose figures depend on the trace alone.
  if (config.deterministic) options.storage_recompute_ns_per_token = 0;
  // Reproducible: write-ahead's rounds inside the allocations that make
  // them due; otherwise on their own thread, as in the daemon.
  options.write_ahead_thread = !config.deterministic;
  std::string segments;  // Prefix of the segments to remove at the end.
  if (!config.state_dir.empty()) {
    static std::atomic<int> runs{0};
    options.state_dir = config.state_dir;
    options.shm_prefix = absl::StrCat("/hicache-replay", getpid(), "-",
                                      runs.fetch_add(1));
    segments = absl::StrCat(options.shm_prefix, "-");
  }
  std::unique_ptr<events::KvEventPublisher> publisher;
  if (!config.kv_events_endpoint.empty()) {
    daemon.kv_events.endpoint = config.kv_events_endpoint;
    daemon.kv_events.block_size = config.kv_events_block_size;
    daemon.kv_events.instance = "replay";
    auto created = events::KvEventPublisher::Create(
        events::KvEventPublisherOptionsFrom(daemon));
    if (!created.ok()) return created.status();
    publisher = *std::move(created);
    options.tier_listener = publisher.get();
    options.tier_block_size = config.kv_events_block_size;
  }
  std::unique_ptr<FilePageStore> store;
  std::string l3_temp;  // A directory to remove at the end.
  if (config.l3_blocks > 0) {
    absl::StatusOr<KvGeometry> geometry = KvGeometry::Resolve(
        options.kv_preset, options.kv_families, options.page_size);
    if (!geometry.ok()) return geometry.status();
    FilePageStoreOptions l3;
    l3.directory = config.l3_dir;
    if (l3.directory.empty()) {
      char dir[] = "/tmp/hicache-replay-l3-XXXXXX";
      if (::mkdtemp(dir) == nullptr) {
        return absl::UnavailableError("mkdtemp for the storage tier failed");
      }
      l3.directory = l3_temp = dir;
    }
    l3.page_bytes = static_cast<int64_t>(geometry->BytesPerPage());
    l3.capacity_pages = config.l3_blocks * pages_per_block;
    auto opened = FilePageStore::Open(std::move(l3));
    if (!opened.ok()) return opened.status();
    store = *std::move(opened);
    options.storage = {store.get()};
  }
  absl::StatusOr<ReplayOutcome> out =
      ReplayWith(trace, config, options, publisher.get());
  if (store != nullptr && out.ok()) out->store = store->Stats();
  store.reset();
  if (!l3_temp.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(l3_temp, ec);
  }
  if (!segments.empty()) {
    if (absl::Status removed = RemoveShmSegments(segments); !removed.ok()) {
      return removed;
    }
  }
  return out;
}

namespace {

absl::StatusOr<ReplayOutcome> ReplayWith(const std::vector<TraceRequest>& trace,
                                         const ReplayConfig& config,
                                         EngineOptions options,
                                         events::KvEventPublisher* events) {
  const int64_t block = config.block_tokens;
  const uint32_t page = config.page_size;
  FaultyTransferEngine* slow = nullptr;
  if (config.slow_backups_for > 0) {
    options.wrap_transfer = [&slow](TransferListener* listener,
                                    const TransferEngineFactory& backend) {
      auto engine = std::make_unique<FaultyTransferEngine>(listener, backend);
      slow = engine.get();
      return engine;
    };
  }
  auto created = HiCacheEngine::Create(options);
  if (!created.ok()) return created.status();
  HiCacheEngine& e = **created;
  auto hold_backups = [&slow] {
    slow->HoldWhen([](const TransferSite& site) {
      return site.direction == TransferDirection::kDeviceToHost;
    });
  };
  if (slow != nullptr) hold_backups();
  // Waits until every copy has completed: time passes for held backups too.
  auto settle = [&] {
    if (slow == nullptr) return e.WaitForTransfers();
    slow->HoldWhen(nullptr);
    slow->ReleaseHeld();
    e.WaitForTransfers();
    hold_backups();
  };
  ReplayOutcome out;
  // Each namespace's requests run as one bound holder (a session's).
  std::map<std::string, uint64_t> holders;
  auto holder_of = [&](const std::string& ns) {
    auto [it, added] = holders.emplace(ns, holders.size() + 1);
    if (added) e.BindHolder(it->second, ns);
    return it->second;
  };
  // Guarantees: what each guaranteed namespace held before a request.
  std::map<std::string, NamespaceQuota> guaranteed;
  for (const NamespaceQuota& q : options.namespace_quotas) {
    if (q.device_guaranteed > 0 || q.host_guaranteed > 0) guaranteed[q.ns] = q;
  }
  auto pages_now = [&] {
    std::map<std::string, std::pair<int64_t, int64_t>> now;
    if (guaranteed.empty()) return now;
    for (const NamespaceQuotaUsage& u : e.NamespaceQuotas()) {
      now[u.quota.ns] = {u.device_cached_pages, u.host_pages};
    }
    return now;
  };
  auto check_guarantees = [&](const std::string& requester,
                              std::map<std::string, std::pair<int64_t, int64_t>>
                                  before) {
    if (guaranteed.empty()) return;
    auto after = pages_now();
    for (const auto& [ns, q] : guaranteed) {
      if (ns == requester) continue;
      NamespaceOutcome& o = out.namespaces[ns];
      const auto [dev0, host0] = before[ns];
      const auto [dev1, host1] = after[ns];
      if (dev1 < std::min(dev0, q.device_guaranteed) ||
          host1 < std::min(host0, q.host_guaranteed)) {
        ++o.guarantee_breaches;
      }
      if (dev0 >= q.device_guaranteed && q.device_guaranteed > 0) {
        o.min_device_pages_once_guaranteed =
            o.min_device_pages_once_guaranteed < 0
                ? dev1
                : std::min(o.min_device_pages_once_guaranteed, dev1);
      }
      if (host0 >= q.host_guaranteed && q.host_guaranteed > 0) {
        o.min_host_pages_once_guaranteed =
            o.min_host_pages_once_guaranteed < 0
                ? host1
                : std::min(o.min_host_pages_once_guaranteed, host1);
      }
    }
  };
  std::vector<double> latencies;
  latencies.reserve(trace.size());
  std::vector<double> admits;
  std::vector<int32_t> tokens;
  const auto start = std::chrono::steady_clock::now();
  const double thread_cpu_start = ThreadCpuSeconds();
  for (const TraceRequest& request : trace) {
    const auto request_start = std::chrono::steady_clock::now();
    ++out.requests;
    if (slow != nullptr && out.requests % config.slow_backups_for == 0) {
      slow->ReleaseHeld();
    }
    TraceTokensInto(request, block, &tokens);
    const int64_t n = static_cast<int64_t>(tokens.size());
    const std::string& ns = request.ns;
    const uint64_t holder = holder_of(ns);
    const auto before = pages_now();
    absl::StatusOr<LoadResult> load = e.LoadBack(ns, tokens);
    if (!load.ok()) return load.status();
    int64_t loaded = load->loaded_len;
    if (load->op_id != 0) {
      absl::StatusOr<bool> done;
      while ((done = e.LoadDone(load->op_id)).ok() && !*done) settle();
      if (!done.ok()) loaded = 0;  // A failed load is a miss.
    }
    out.blocks += static_cast<int64_t>(request.hash_ids.size());
    out.l1_hit_blocks += load->device_len / block;
    out.l12_hit_blocks +=
        (load->device_len + loaded - std::min(loaded, load->storage_len)) /
        block;
    out.l123_hit_blocks += (load->device_len + loaded) / block;
    NamespaceOutcome& mine = out.namespaces[ns];
    ++mine.requests;
    mine.blocks += static_cast<int64_t>(request.hash_ids.size());
    mine.l1_hit_blocks += load->device_len / block;
    mine.l12_hit_blocks +=
        (load->device_len + loaded - std::min(loaded, load->storage_len)) /
        block;
    const int64_t reuse = (load->device_len + loaded) / page;
    std::vector<LogicalPage> pages(load->pages.begin(),
                                   load->pages.begin() + reuse);
    const int64_t need = (n + page - 1) / page - reuse;
    const auto admit_start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<LogicalPage>> fresh =
        need > 0 ? e.Allocate(need, holder) : std::vector<LogicalPage>{};
    if (!fresh.ok()) {
      ++out.failed_allocations;
    } else {
      pages.insert(pages.end(), fresh->begin(), fresh->end());
      uint64_t op = 0;
      // What BACKUP_CHOICE_AUTO does: per-layer write-through of the new
      // pages while the forward runs, where the write policy asks for it.
      if (need > 0 && e.BacksUpAtAdmit(load->node, *fresh)) {
        auto ops =
            e.PrepareBackups({BackupSpec{*fresh, n - reuse * page}}, holder);
        if (ops.ok() && (*ops)[0] != 0) op = (*ops)[0];
      }
      if (need > 0) {
        admits.push_back(std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - admit_start)
                             .count());
      }
      // The forward: its layers stored.
      if (op != 0) {
        if (absl::Status s = e.StoreAllLayers(op); !s.ok()) return s;
      }
      absl::StatusOr<InsertResult> inserted =
          e.Insert(ns, tokens, pages, {}, holder);
      if (!inserted.ok()) return inserted.status();
      if (inserted->deferred) ++out.deferred_inserts;
      // Deferred: wait for the conflicting backup to settle, then retry.
      for (int retry = 0; inserted->deferred && retry < config.defer_retries;
           ++retry) {
        settle();
        inserted = e.Insert(ns, tokens, pages, {}, holder);
        if (!inserted.ok()) return inserted.status();
        if (!inserted->deferred) ++out.deferred_retried;
      }
      if (inserted->deferred) {
        // Give up: the backup goes, and so do the pages this request took.
        ++out.deferred_gave_up;
        if (op != 0) {
          if (absl::Status s = e.RollbackBackup(op); !s.ok()) return s;
        }
        if (absl::Status s = e.Free(*fresh, holder); !s.ok()) return s;
      } else {
        if (op != 0) {
          if (absl::Status s = e.AttachBackup(op, inserted->node); !s.ok()) {
            if (absl::Status r = e.RollbackBackup(op); !r.ok()) return r;
          }
        }
        for (const auto* list :
             {&inserted->duplicate_pages, &inserted->uncached_pages,
              &inserted->released_pages}) {
          if (list->empty()) continue;
          if (absl::Status s = e.Free(*list, holder); !s.ok()) return s;
        }
      }
    }
    if (load->op_id != 0) {
      if (absl::Status s = e.FinishLoad(load->op_id); !s.ok()) return s;
    } else if (absl::Status s = e.Unlock(load->node); !s.ok()) {
      return s;
    }
    if (config.deterministic && slow == nullptr) e.WaitForTransfers();
    if (config.deterministic && e.storage() != nullptr) e.storage()->Flush();
    check_guarantees(ns, before);
    latencies.push_back(std::chrono::duration<double, std::micro>(
                            std::chrono::steady_clock::now() - request_start)
                            .count());
  }
  settle();
  // The journal's work counts too: everything recorded is made durable
  // before the clock stops (OK without a state_dir).
  const auto flush_start = std::chrono::steady_clock::now();
  if (absl::Status flushed = e.FlushHostTier(/*clean=*/false); !flushed.ok()) {
    return flushed;
  }
  out.flush_seconds = std::chrono::duration<double>(
                          std::chrono::steady_clock::now() - flush_start)
                          .count();
  out.seconds = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - start)
                    .count();
  out.caller_cpu_seconds = ThreadCpuSeconds() - thread_cpu_start;
  // KV events are published in the background; how long after the last
  // request the last of them was sent.
  if (events != nullptr) {
    const auto events_start = std::chrono::steady_clock::now();
    events->Flush();
    out.kv_events_lag_seconds = std::chrono::duration<double>(
                                    std::chrono::steady_clock::now() -
                                    events_start)
                                    .count();
  }
  out.request_p50_us = Percentile(latencies, 0.5);
  out.request_p99_us = Percentile(latencies, 0.99);
  out.admit_p50_us = Percentile(admits, 0.5);
  out.admit_p99_us = Percentile(admits, 0.99);
  out.stats = e.Stats();
  out.persistence = e.Persistence();
  out.leaked_pages = e.AllRequestPages();
  if (events != nullptr) {
    const events::KvEventPublisherStats s = events->stats();
    out.kv_events = s.events_published;
    out.kv_event_blocks = s.blocks_published;
    out.kv_event_batches = s.batches_published;
    out.kv_events_dropped = s.events_dropped;
    e.DetachTierListener();
  }
  if (absl::Status s = e.CheckInvariants(); !s.ok()) return s;
  return out;
}

}  // namespace

}  // namespace hicache
