// Hot restart of the host tier (docs/hot-restart.md, issue 15): how long an
// engine takes to come back with ~1M host pages recovered from its journal.
//
// Shape: one in-process HiCacheEngine (CPU backend, --kv_preset, P = 64,
// --cp_size ranks of --pages_per_rank host pages, a fixed shm prefix
// "/hicache-bench<pid>" and a state_dir under $TMPDIR). The fill drives the
// engine's own API as a scheduler with write_through does: Allocate a node's
// pages, PrepareBackups + StoreAllLayers, Insert, AttachBackup, until
// --fill_pages host pages are committed (each node --node_pages pages, all
// children of the root, distinct tokens); the journal is written by the
// engine's background writer as in hicached. The engine is then destroyed
// (the journal flushed clean, the host segments kept) and recreated --runs
// times: every HiCacheEngine::Create attaches the same segments, loads the
// journal, verifies every page and restores the tree, then rewrites the
// journal compacted (JournalWriter::Open). Each run is checked: every page
// recovered, nothing dropped.
//
// Printed per run and as p50/p99 over the runs:
//   create   wall time of HiCacheEngine::Create (everything);
//   recovery HostTierPersistence::recovery_time (journal load, verify,
//            restore, journal rewrite; not the pool attach);
//   load     persist::LoadJournal of the same journal just before the run
//            (read + parse, timed here on its own);
//   verify   the engine's own verification time (its log line), and the
//            verified bytes over it in GB/s;
//   rest     recovery - load - verify: reserving pages, restoring nodes and
//            rewriting the journal;
//   rewrite  JournalWriter::Open of the loaded records into a scratch
//            directory beside the state_dir, timed on its own before the run
//            (the journal rewrite that "rest" includes).
// The verify throughput is extrapolated to --extrapolate_preset pages.
// Segments "/dev/shm/hicache-bench<pid>-*" are removed at the end, and at
// the start those of benches whose process is gone (a killed run leaves
// 2 GiB behind otherwise).
//
//   bazel build --config=opt //bench:hot_restart_bench
//   bazel-out/k8-opt/bin/bench/hot_restart_bench   (C = 1, 1M pages)
//   bazel-out/k8-opt/bin/bench/hot_restart_bench --cp_size=4
//       --pages_per_rank=262144
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/percentile.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/pool/shm_segments.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/persist/journal_writer.h"
#include "daemon/persist/state_dir.h"
#include "daemon/pool/kv_geometry.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(int, cp_size, 1, "CP size (ranks, all served in process).");
ABSL_FLAG(int64_t, pages_per_rank, 1 << 20,
          "Host pages committed per rank (the pool has 1% more).");
ABSL_FLAG(int64_t, node_pages, 16, "Pages per node (per rank: x cp_size).");
ABSL_FLAG(std::string, kv_preset, "tiny", "KV preset of the pools.");
ABSL_FLAG(int, runs, 5, "Recoveries to time.");
ABSL_FLAG(int, recovery_threads, 2, "EngineOptions::recovery_threads.");
ABSL_FLAG(std::string, extrapolate_preset, "deepseek-v3.2-fp8",
          "Preset whose 1M-page verification time is extrapolated.");

namespace hicache {
namespace {

constexpr uint32_t kPageSize = 64;

// Captures the verification time from the engine's "host tier recovered"
// log line ("(<bytes> bytes verified in <duration>)").
class VerifySink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  absl::Duration TakeVerifyTime() {
    std::lock_guard<std::mutex> lock(mutex_);
    absl::Duration out = verify_;
    verify_ = absl::InfiniteDuration();
    return out;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string text(msg.payload.data(), msg.payload.size());
    // Every fill backup warns that it copies all layers at once (the fill
    // has no forward pass): not news.
    if (msg.level >= spdlog::level::warn &&
        !absl::StrContains(text, "all-layer fallback")) {
      std::fprintf(stderr, "engine log: %s\n", text.c_str());
    }
    const std::string key = " bytes verified in ";
    const size_t at = text.find(key);
    if (at == std::string::npos) return;
    const size_t from = at + key.size();
    const size_t to = text.find(')', from);
    absl::Duration parsed;
    if (to != std::string::npos &&
        absl::ParseDuration(text.substr(from, to - from), &parsed)) {
      verify_ = parsed;
    }
  }
  void flush_() override {}

 private:
  absl::Duration verify_ = absl::InfiniteDuration();
};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Removes the segments of hot_restart_bench processes that no longer exist.
absl::Status RemoveDeadBenchSegments() {
  const std::string tag = "/hicache-bench";
  for (const std::string& name : ListShmSegments(tag)) {
    const size_t dash = name.find('-', tag.size());
    int pid = 0;
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(name.substr(tag.size(), dash - tag.size()), &pid) ||
        pid <= 0) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      if (absl::Status removed = RemoveShmSegments(name); !removed.ok()) {
        return removed;
      }
    }
  }
  return absl::OkStatus();
}

// Commits `pages_per_rank * cp_size` host pages through the engine API.
absl::Status Fill(HiCacheEngine& e, int64_t total_pages, int64_t node_pages) {
  const int64_t nodes = total_pages / node_pages;
  const int64_t tokens_per_node = node_pages * kPageSize;
  std::vector<int32_t> tokens(tokens_per_node);
  const int64_t batch = std::max<int64_t>(
      1, e.DevicePageCapacity() / 2 / node_pages);  // Nodes per settle.
  for (int64_t i = 0; i < nodes; ++i) {
    for (int64_t t = 0; t < tokens_per_node; ++t) {
      tokens[t] = static_cast<int32_t>(i * tokens_per_node + t + 1);
    }
    absl::StatusOr<std::vector<LogicalPage>> pages = e.Allocate(node_pages);
    if (!pages.ok()) return pages.status();
    absl::StatusOr<std::vector<uint64_t>> ops =
        e.PrepareBackups({BackupSpec{*pages, tokens_per_node}});
    if (!ops.ok()) return ops.status();
    const uint64_t op = (*ops)[0];
    if (op == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no host room for node ", i));
    }
    if (absl::Status s = e.StoreAllLayers(op); !s.ok()) return s;
    absl::StatusOr<InsertResult> inserted = e.Insert("", tokens, *pages);
    if (!inserted.ok()) return inserted.status();
    if (inserted->deferred || inserted->cached_len != tokens_per_node) {
      return absl::InternalError(absl::StrCat("node ", i, " not cached"));
    }
    if (absl::Status s = e.AttachBackup(op, inserted->node); !s.ok()) return s;
    if ((i + 1) % batch == 0) e.WaitForTransfers();
  }
  e.WaitForTransfers();
  return e.FlushHostTier(/*clean=*/false);
}

int Main() {
  const int cp = absl::GetFlag(FLAGS_cp_size);
  const int64_t per_rank = absl::GetFlag(FLAGS_pages_per_rank);
  const int64_t node_pages = absl::GetFlag(FLAGS_node_pages) * cp;
  const int64_t total_pages = per_rank * cp / node_pages * node_pages;
  auto sink = std::make_shared<VerifySink>();
  spdlog::default_logger()->sinks().clear();
  spdlog::default_logger()->sinks().push_back(sink);
  spdlog::set_level(spdlog::level::info);

  if (absl::Status swept = RemoveDeadBenchSegments(); !swept.ok()) {
    std::fprintf(stderr, "%s\n", swept.ToString().c_str());
    return 1;
  }
  char dir_template[] = "/tmp/hicache-hot-restart-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string state_dir = absl::StrCat(dir_template, "/state");
  const std::string scratch_dir = absl::StrCat(dir_template, "/scratch");
  const std::string prefix = absl::StrCat("/hicache-bench", getpid());

  EngineOptions options;
  options.page_size = kPageSize;
  options.cp_size = cp;
  options.kv_preset = absl::GetFlag(FLAGS_kv_preset);
  options.host_pages_per_rank = per_rank + per_rank / 100;
  options.device_pages_per_rank = 1 + 64 * node_pages / cp;
  options.write_policy = WritePolicy::kWriteThrough;
  options.eviction_policy = EvictionPolicy::kLru;
  options.transfer_workers = 2;
  options.state_dir = state_dir;
  options.recovery_threads = absl::GetFlag(FLAGS_recovery_threads);
  options.shm_prefix = prefix;

  absl::StatusOr<KvGeometry> geometry =
      KvGeometry::Preset(options.kv_preset, kPageSize);
  if (!geometry.ok()) {
    std::fprintf(stderr, "%s\n", geometry.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "hot restart: preset %s (%llu bytes/page), C=%d, %lld host pages per "
      "rank committed (%lld in all, %.2f GiB), nodes of %lld pages, "
      "recovery_threads %d, %d runs\n",
      options.kv_preset.c_str(),
      static_cast<unsigned long long>(geometry->BytesPerPage()), cp,
      static_cast<long long>(total_pages / cp),
      static_cast<long long>(total_pages),
      geometry->PoolBytes(total_pages) / double(1 << 30),
      static_cast<long long>(node_pages), options.recovery_threads,
      absl::GetFlag(FLAGS_runs));
  int rc = 0;
  auto fail = [&rc](const std::string& what, const absl::Status& status) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
    rc = 1;
  };
  {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<HiCacheEngine>> created =
        HiCacheEngine::Create(options);
    if (!created.ok()) {
      fail("create", created.status());
    } else if (absl::Status filled = Fill(**created, total_pages, node_pages);
               !filled.ok()) {
      fail("fill", filled);
    } else {
      const HostTierPersistence p = (*created)->Persistence();
      const double secs = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count();
      std::printf(
          "fill: %.1f s, %lld journal puts, %lld live, journal %.1f MiB, "
          "status %s\n",
          secs, static_cast<long long>(p.journal_puts),
          static_cast<long long>(p.journal_live),
          p.journal_file_bytes / double(1 << 20), p.journal_status.c_str());
    }
  }
  std::vector<double> create_s, recovery_s, load_s, verify_s, rest_s, gbps,
      close_s, rewrite_s;
  std::printf("%4s %9s %9s %9s %9s %9s %9s %9s %9s %10s\n", "run",
              "create s", "recovery", "load s", "verify s", "rest s",
              "rewrite", "GB/s", "close s", "pages");
  for (int run = 0; rc == 0 && run < absl::GetFlag(FLAGS_runs); ++run) {
    absl::StatusOr<persist::LoadedJournal> loaded =
        persist::LoadJournal(state_dir, nullptr);
    if (!loaded.ok()) {
      fail("load", loaded.status());
      break;
    }
    const double load = Seconds(loaded->read_time + loaded->parse_time);
    double rewrite = 0;
    {
      if (absl::Status made = persist::PrepareStateDir(scratch_dir);
          !made.ok()) {
        fail("scratch", made);
        break;
      }
      const auto rewrite_start = std::chrono::steady_clock::now();
      absl::StatusOr<std::unique_ptr<persist::JournalWriter>> writer =
          persist::JournalWriter::Open(scratch_dir, loaded->geometry,
                                       loaded->puts);
      rewrite = std::chrono::duration<double>(
                    std::chrono::steady_clock::now() - rewrite_start)
                    .count();
      if (!writer.ok()) {
        fail("rewrite", writer.status());
        break;
      }
      writer->reset();
      std::error_code ignored;
      std::filesystem::remove_all(scratch_dir, ignored);
    }
    loaded = persist::LoadedJournal();  // Free it before the run.
    sink->TakeVerifyTime();
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<HiCacheEngine>> created =
        HiCacheEngine::Create(options);
    const double create = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count();
    if (!created.ok()) {
      fail("recover", created.status());
      break;
    }
    const HostTierPersistence p = (*created)->Persistence();
    const absl::Duration verify_time = sink->TakeVerifyTime();
    if (!p.recovered || p.pages_recovered != total_pages ||
        p.dropped_checksum + p.dropped_orphan + p.dropped_conflict != 0 ||
        verify_time == absl::InfiniteDuration()) {
      fail("recover", absl::InternalError(absl::StrCat(
                          "recovered ", p.pages_recovered, " of ", total_pages,
                          " pages; dropped ", p.dropped_checksum, "/",
                          p.dropped_orphan, "/", p.dropped_conflict,
                          "; cold: ", p.cold_reason)));
      break;
    }
    const double verify = Seconds(verify_time);
    const double recovery = Seconds(p.recovery_time);
    const auto close_start = std::chrono::steady_clock::now();
    created->reset();
    const double close = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - close_start)
                             .count();
    create_s.push_back(create);
    recovery_s.push_back(recovery);
    load_s.push_back(load);
    verify_s.push_back(verify);
    rest_s.push_back(recovery - load - verify);
    gbps.push_back(p.verified_bytes / verify / 1e9);
    close_s.push_back(close);
    rewrite_s.push_back(rewrite);
    std::printf("%4d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.2f %9.3f %10lld\n",
                run, create, recovery, load, verify, recovery - load - verify,
                rewrite, gbps.back(), close,
                static_cast<long long>(p.pages_recovered));
  }
  if (rc == 0 && !create_s.empty()) {
    for (double q : {0.5, 0.99}) {
      std::printf("%4s %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.2f %9.3f\n",
                  q == 0.5 ? "p50" : "p99", Percentile(create_s, q),
                  Percentile(recovery_s, q), Percentile(load_s, q),
                  Percentile(verify_s, q), Percentile(rest_s, q),
                  Percentile(rewrite_s, q), Percentile(gbps, 1 - q),
                  Percentile(close_s, q));
    }
    absl::StatusOr<KvGeometry> other = KvGeometry::Preset(
        absl::GetFlag(FLAGS_extrapolate_preset), kPageSize);
    if (other.ok()) {
      const double bytes = other->PoolBytes(1 << 20);
      std::printf(
          "extrapolated: 1M pages of %s (%llu bytes/page, %.0f GB) verify in "
          "%.0f s at the median %.2f GB/s\n",
          absl::GetFlag(FLAGS_extrapolate_preset).c_str(),
          static_cast<unsigned long long>(other->BytesPerPage()), bytes / 1e9,
          bytes / 1e9 / Percentile(gbps, 0.5), Percentile(gbps, 0.5));
    }
  }
  if (absl::Status removed = RemoveShmSegments(absl::StrCat(prefix, "-"));
      !removed.ok()) {
    fail("cleanup", removed);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_template, ignored);
  return rc;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return hicache::Main();
}
