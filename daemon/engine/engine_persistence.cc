// HiCacheEngine: hot restart of the host tier (docs/hot-restart.md). At
// start, with a state_dir, the host pools were attached (RankPools) and the
// journal is replayed into the tree after every page verifies; from then on
// the tree reports every host-tier change to a HostTierRecorder that keeps
// the journal.
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/persist/state_dir.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::Status HiCacheEngine::OpenHostTier() {
  if (options_.state_dir.empty()) return absl::OkStatus();
  if (layout_.served_ranks().size() != options_.cp_size) {
    return absl::InvalidArgumentError(
        "state_dir needs every rank served by this engine: the host tier of a "
        "multi-daemon CP group does not persist yet");
  }
  if (absl::Status dir = persist::PrepareStateDir(options_.state_dir);
      !dir.ok()) {
    return dir;
  }
  const absl::Time start = absl::Now();
  const persist::JournalGeometry geometry{
      .page_size = options_.page_size,
      .cp_size = options_.cp_size,
      .kv_fingerprint = geometry_.HostFingerprint(
          options_.host_layout, options_.host_pages_per_rank,
          options_.cp_size),
      .host_layout = std::string(HostLayoutName(options_.host_layout)),
      .host_pages_per_rank = options_.host_pages_per_rank,
      .instance = options_.shm_prefix};
  absl::StatusOr<std::unique_ptr<PageKeyStore>> keys =
      PageKeyStore::Open({.prefix = options_.shm_prefix,
                          .num_ranks = static_cast<Rank>(options_.cp_size),
                          .pages_per_rank = options_.host_pages_per_rank,
                          .page_size = options_.page_size,
                          .fingerprint = geometry.kv_fingerprint});
  if (!keys.ok()) return keys.status();
  page_keys_ = *std::move(keys);
  for (const std::string& name : page_keys_->removed()) {
    spdlog::info("host tier: removed the page keys {} of another geometry",
                 name);
  }
  std::vector<persist::PutRecord> survivors;
  std::string cold;
  if (!pools_->host_attached()) {
    cold = "no host pools of this geometry survived (first start, a reboot "
           "or a geometry change)";
  } else if (!page_keys_->attached()) {
    cold = "the host pools survived but their page keys did not";
  } else {
    const absl::Time load_start = absl::Now();
    absl::StatusOr<persist::LoadedJournal> loaded =
        persist::LoadJournal(options_.state_dir, &geometry);
    load_time_ = absl::Now() - load_start;
    if (!loaded.ok()) {
      cold = absl::StrCat("the journal cannot be used: ",
                          loaded.status().ToString());
    } else {
      std::vector<HostPageAllocator*> allocators;
      std::vector<absl::Span<const uint8_t>> bytes;
      MutexLock lock(&mu_);
      for (Rank r = 0; r < options_.cp_size; ++r) {
        allocators.push_back(host_[r].get());
        const KvPool* pool = pools_->host(r);
        bytes.emplace_back(static_cast<const uint8_t*>(pool->host_data()),
                           pool->size_bytes());
      }
      absl::StatusOr<HostTierRecovery> recovery = RecoverHostTier(
          *loaded, {.tree = tree_.get(),
                    .allocators = allocators,
                    .geometry = geometry_,
                    .layout = options_.host_layout,
                    .host_pages_per_rank = options_.host_pages_per_rank,
                    .pools = bytes,
                    .keys = page_keys_.get(),
                    .verify_threads = options_.recovery_threads});
      if (!recovery.ok()) return recovery.status();
      recovery_ = *std::move(recovery);
      recovered_ = true;
      survivors = std::move(recovery_.survivors);
      recovery_.survivors.clear();  // Moved from: only the figures stay.
      if (!loaded->stop_reason.empty()) {
        spdlog::warn(
            "host tier: the journal's last {} bytes were dropped: {}",
            loaded->dropped_bytes, loaded->stop_reason);
      }
    }
  }
  if (!cold.empty()) {
    cold_reason_ = cold;
    spdlog::warn("host tier: starting cold: {}", cold);
  }
  absl::StatusOr<std::unique_ptr<persist::JournalWriter>> journal =
      persist::JournalWriter::Open(options_.state_dir, geometry, survivors);
  if (!journal.ok()) return journal.status();
  journal_ = *std::move(journal);
  HostTierRecorder::Options recorder{.geometry = geometry_,
                                     .layout = options_.host_layout,
                                     .host_pages_per_rank =
                                         options_.host_pages_per_rank,
                                     .journal = journal_.get(),
                                     .keys = page_keys_.get(),
                                     .settle = options_.journal_settle};
  for (Rank r = 0; r < options_.cp_size; ++r) {
    const KvPool* pool = pools_->host(r);
    recorder.pools.push_back(
        {.rank = r,
         .bytes = absl::Span<const uint8_t>(
             static_cast<const uint8_t*>(pool->host_data()),
             pool->size_bytes())});
  }
  recorder_ = std::make_unique<HostTierRecorder>(std::move(recorder));
  {
    MutexLock lock(&mu_);
    tree_->SetHostTierListener(recorder_.get(), recovery_.next_persist_id);
  }
  recovery_time_ = absl::Now() - start;
  if (recovered_) {
    spdlog::info(
        "host tier recovered in {}: {} nodes, {} pages ({} bytes verified in "
        "{}); dropped {} nodes whose pages failed their checksums, {} whose "
        "parent was gone, {} in conflict",
        absl::FormatDuration(recovery_time_), recovery_.nodes_recovered,
        recovery_.pages_recovered, recovery_.verified_bytes,
        absl::FormatDuration(recovery_.verify_time),
        recovery_.dropped_checksum, recovery_.dropped_orphan,
        recovery_.dropped_conflict);
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::FlushHostTier(bool clean) {
  if (recorder_ == nullptr) return absl::OkStatus();
  return recorder_->Flush(clean);
}

void HiCacheEngine::CloseHostTier() {
  if (recorder_ == nullptr) return;
  {
    // Detached and flushed under the engine's lock: the tree cannot change
    // between the two. A drop after the detach would not reach the
    // recorder, and a commit still settling could then be hashed over pages
    // already reused (docs/hot-restart.md §4). The recorder's worker and the
    // journal never take this lock.
    MutexLock lock(&mu_);
    tree_->SetHostTierListener(nullptr);
    if (absl::Status flushed = recorder_->Flush(/*clean=*/true);
        !flushed.ok()) {
      spdlog::error("host tier: the journal could not be flushed: {}",
                    flushed);
    }
    // Flushed: its worker has handled every commit and reads no key.
    tree_->ReleaseKeyHolds(*recorder_);
  }
  recorder_.reset();
  journal_.reset();
  // The pools and the page keys stay for the next daemon (their segments
  // are kept).
}

HostTierPersistence HiCacheEngine::Persistence() const {
  HostTierPersistence out;
  if (journal_ == nullptr) return out;
  out.enabled = true;
  out.recovered = recovered_;
  out.cold_reason = cold_reason_;
  out.nodes_recovered = recovery_.nodes_recovered;
  out.pages_recovered = recovery_.pages_recovered;
  out.dropped_checksum = recovery_.dropped_checksum;
  out.dropped_orphan = recovery_.dropped_orphan;
  out.dropped_conflict = recovery_.dropped_conflict;
  out.verified_bytes = recovery_.verified_bytes;
  out.recovery_time = recovery_time_;
  out.load_time = load_time_;
  out.verify_time = recovery_.verify_time;
  out.restore_time = recovery_.restore_time;
  const HostTierRecorderStats recorded = recorder_->stats();
  out.journal_puts = recorded.puts;
  out.journal_puts_refused = recorded.puts_refused;
  out.journal_stopped = recorded.events_refused > 0;
  out.journal_backlog_events = recorded.backlog_events;
  out.recorder_lag_p50 = absl::Nanoseconds(recorded.lag.QuantileNs(0.5));
  out.recorder_lag_p99 = absl::Nanoseconds(recorded.lag.QuantileNs(0.99));
  out.recorder_lag_max = absl::Nanoseconds(recorded.lag.max_ns());
  // Without the journal's lock: its writer runs in the background.
  const persist::JournalWriter::Summary written = journal_->summary();
  out.journal_live = written.live_puts;
  out.journal_file_bytes = written.file_bytes;
  out.journal_not_durable_records =
      static_cast<int64_t>(written.not_durable_records);
  out.writer_lag_p50 = absl::Nanoseconds(written.batch_lag_p50_ns);
  out.writer_lag_p99 = absl::Nanoseconds(written.batch_lag_p99_ns);
  out.writer_lag_max = absl::Nanoseconds(written.batch_lag_max_ns);
  // A broken journal's writer is idle: its status is read at once.
  const absl::Status status =
      written.broken ? journal_->status() : absl::OkStatus();
  out.journal_status = status.ok() ? "OK" : status.ToString();
  if (status.ok() && out.journal_stopped) {
    out.journal_status =
        "recording stopped: the recorder fell too far behind (a restart "
        "recovers what was recorded before, and records again)";
  }
  return out;
}

}  // namespace hicache
