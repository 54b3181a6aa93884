#include "daemon/persist/journal_writer.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/background_thread.h"
#include "daemon/persist/posix_journal_fs.h"
#include "daemon/persist/state_dir.h"

namespace hicache::persist {

JournalWriter::JournalWriter(std::string state_dir, JournalGeometry geometry,
                             JournalWriterOptions options)
    : state_dir_(std::move(state_dir)),
      geometry_(std::move(geometry)),
      options_(options),
      fs_(options.fs != nullptr ? options.fs : PosixJournalFs::Default()) {}

absl::StatusOr<std::unique_ptr<JournalWriter>> JournalWriter::Open(
    const std::string& state_dir, const JournalGeometry& geometry,
    const std::vector<PutRecord>& live, JournalWriterOptions options) {
  if (absl::Status s = ValidateGeometry(geometry); !s.ok()) return s;
  absl::StatusOr<std::string> geometry_frame = EncodeGeometryRecord(geometry);
  if (!geometry_frame.ok()) return geometry_frame.status();
  std::unique_ptr<JournalWriter> writer(
      new JournalWriter(state_dir, geometry, options));
  writer->geometry_frame_ = *std::move(geometry_frame);

  std::vector<std::pair<uint64_t, Live>> entries;
  entries.reserve(live.size());
  uint64_t live_bytes = 0;
  for (const PutRecord& put : live) {
    if (absl::Status s = ValidatePut(put, geometry); !s.ok()) {
      return absl::InvalidArgumentError(s.message());
    }
    absl::StatusOr<std::string> frame = EncodePutRecord(put);
    if (!frame.ok()) return frame.status();
    live_bytes += frame->size();
    entries.emplace_back(
        put.persist_id,
        Live{put.parent_persist_id,
             std::make_shared<const std::string>(*std::move(frame))});
  }
  {
    absl::flat_hash_map<uint64_t, bool> seen;
    for (const auto& [id, entry] : entries) {
      if (!seen.emplace(id, true).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("Put ", id, " appears twice in the live set"));
      }
    }
  }
  uint64_t file_bytes = 0;
  bool renamed = false;
  absl::StatusOr<std::unique_ptr<JournalFile>> file = writer->WriteSnapshot(
      ParentsFirst(entries), false, &file_bytes, &renamed);
  if (!file.ok()) return file.status();
  writer->file_ = *std::move(file);
  {
    MutexLock lock(&writer->mu_);
    for (auto& [id, entry] : entries) {
      writer->live_.emplace(id, std::move(entry));
    }
    writer->stats_.live_puts = static_cast<int64_t>(writer->live_.size());
    writer->stats_.live_bytes = live_bytes;
    writer->stats_.file_bytes = file_bytes;
    writer->PublishLocked();
  }
  writer->thread_ = std::thread([w = writer.get()] { w->Run(); });
  return writer;
}

JournalWriter::~JournalWriter() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

std::vector<JournalWriter::Live> JournalWriter::ParentsFirst(
    std::vector<std::pair<uint64_t, Live>> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  absl::flat_hash_map<uint64_t, std::vector<size_t>> children;
  absl::flat_hash_map<uint64_t, size_t> index;
  std::vector<size_t> level;
  for (size_t i = 0; i < entries.size(); ++i) {
    index[entries[i].first] = i;
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const uint64_t parent = entries[i].second.parent;
    if (parent == 0) {
      level.push_back(i);
    } else {
      children[parent].push_back(i);
    }
  }
  std::vector<Live> ordered;
  ordered.reserve(entries.size());
  std::vector<bool> placed(entries.size(), false);
  while (!level.empty()) {
    std::vector<size_t> next;
    for (size_t i : level) {
      placed[i] = true;
      ordered.push_back(entries[i].second);
      auto kids = children.find(entries[i].first);
      if (kids != children.end()) {
        next.insert(next.end(), kids->second.begin(), kids->second.end());
      }
    }
    level = std::move(next);
  }
  // Not reachable from a root (parent not live, or a cycle): kept, last; the
  // loader decides (a parent Put may still come).
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!placed[i]) ordered.push_back(entries[i].second);
  }
  return ordered;
}

absl::StatusOr<std::unique_ptr<JournalFile>> JournalWriter::WriteSnapshot(
    const std::vector<Live>& ordered, bool clean, uint64_t* bytes,
    bool* renamed) {
  *renamed = false;
  const std::string tmp = JournalTmpPath(state_dir_);
  absl::StatusOr<std::unique_ptr<JournalFile>> file = fs_->Create(tmp);
  if (!file.ok()) return file.status();
  // Written in chunks of a few MiB: one buffer of the whole live set would
  // double its memory for the duration.
  constexpr size_t kChunk = size_t{4} << 20;
  std::string buffer = EncodeFileHeader();
  buffer += geometry_frame_;
  uint64_t total = 0;
  absl::Status status;
  auto write = [&]() {
    if (status.ok()) status = (*file)->Append(buffer);
    total += buffer.size();
    buffer.clear();
  };
  for (const Live& entry : ordered) {
    buffer += *entry.frame;
    if (buffer.size() >= kChunk) write();
  }
  if (clean) buffer += EncodeCleanRecord();
  write();
  if (status.ok()) status = (*file)->Sync();
  if (status.ok()) {
    status = fs_->Rename(tmp, JournalPath(state_dir_));
    *renamed = status.ok();
  }
  if (status.ok()) status = fs_->SyncDir(state_dir_);
  if (!status.ok()) {
    file->reset();
    // Best effort: the error reported is `status`.
    if (!*renamed) (void)fs_->Remove(tmp);
    return status;
  }
  *bytes = total;
  return file;
}

absl::Status JournalWriter::BrokenError() const {
  return absl::FailedPreconditionError(
      absl::StrCat("journal broken: ", broken_.ToString()));
}

void JournalWriter::Break(absl::Status cause) {
  if (!broken_.ok()) return;
  broken_ = std::move(cause);
  pending_.clear();
  pending_.shrink_to_fit();
  pending_bytes_ = 0;
  live_.clear();
  stats_.queued_bytes = 0;
  PublishLocked();
  durable_cv_.SignalAll();
}

void JournalWriter::PublishLocked() {
  published_live_puts_.store(stats_.live_puts, std::memory_order_relaxed);
  published_file_bytes_.store(stats_.file_bytes, std::memory_order_relaxed);
  published_broken_.store(!broken_.ok(), std::memory_order_relaxed);
  // A broken journal's records are never durable: they stay counted.
  published_not_durable_.store(
      appended_seq_ > durable_seq_ ? appended_seq_ - durable_seq_ : 0,
      std::memory_order_relaxed);
}

JournalWriter::Summary JournalWriter::summary() const {
  return Summary{
      .live_puts = published_live_puts_.load(std::memory_order_relaxed),
      .file_bytes = published_file_bytes_.load(std::memory_order_relaxed),
      .broken = published_broken_.load(std::memory_order_relaxed),
      .not_durable_records =
          published_not_durable_.load(std::memory_order_relaxed),
      .batch_lag_p50_ns = published_lag_p50_ns_.load(std::memory_order_relaxed),
      .batch_lag_p99_ns = published_lag_p99_ns_.load(std::memory_order_relaxed),
      .batch_lag_max_ns =
          published_lag_max_ns_.load(std::memory_order_relaxed)};
}

absl::Status JournalWriter::Put(const PutRecord& put) {
  absl::Status valid = ValidatePut(put, geometry_);
  if (!valid.ok()) return absl::InvalidArgumentError(valid.message());
  absl::StatusOr<std::string> encoded = EncodePutRecord(put);
  if (!encoded.ok()) return encoded.status();
  auto frame = std::make_shared<const std::string>(*std::move(encoded));
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return BrokenError();
    if (live_.contains(put.persist_id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Put: persist_id ", put.persist_id, " is live"));
    }
    if (pending_bytes_ + frame->size() > options_.max_queue_bytes) {
      ++stats_.puts_refused;
      return absl::ResourceExhaustedError(absl::StrCat(
          "journal queue full (", pending_bytes_, " bytes pending)"));
    }
    stats_.live_bytes += frame->size();
    EnqueueLocked(frame);
    live_.emplace(put.persist_id,
                  Live{put.parent_persist_id, std::move(frame)});
    ++stats_.puts;
    stats_.live_puts = static_cast<int64_t>(live_.size());
    PublishLocked();
  }
  return absl::OkStatus();
}

void JournalWriter::EnqueueLocked(std::shared_ptr<const std::string> frame) {
  const bool first = pending_.empty();
  if (first) first_pending_ = absl::Now();
  const size_t before = pending_bytes_;
  pending_bytes_ += frame->size();
  pending_.push_back(std::move(frame));
  ++appended_seq_;
  clean_ = false;
  stats_.queued_bytes = pending_bytes_;
  PublishLocked();
  // The writer needs a wake-up only for a batch's first record (it may be
  // idle) and when the batch reaches batch_bytes; in between, it is waiting
  // for max_delay to pass anyway. One futex wake a batch, not one a record.
  if (first || (before < options_.batch_bytes &&
                pending_bytes_ >= options_.batch_bytes)) {
    work_cv_.Signal();
  }
}

absl::Status JournalWriter::Drop(uint64_t persist_id) {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return BrokenError();
    auto it = live_.find(persist_id);
    if (it == live_.end()) {
      // Nothing to write: no frame is built (most drops of a churning host
      // tier name nodes that were discarded before they were recorded).
      ++stats_.unknown_drops;
      return absl::OkStatus();
    }
    stats_.live_bytes -= it->second.frame->size();
    live_.erase(it);
    // 21 bytes: encoding under the lock costs less than a second lookup.
    EnqueueLocked(
        std::make_shared<const std::string>(EncodeDropRecord(persist_id)));
    ++stats_.drops;
    stats_.live_puts = static_cast<int64_t>(live_.size());
    PublishLocked();
  }
  return absl::OkStatus();
}

absl::Status JournalWriter::Flush() {
  MutexLock lock(&mu_);
  const uint64_t target = appended_seq_;
  if (target > flush_seq_) {
    flush_seq_ = target;
    work_cv_.Signal();
  }
  while (broken_.ok() && durable_seq_ < target) durable_cv_.Wait(&mu_);
  if (!broken_.ok()) return BrokenError();
  return absl::OkStatus();
}

absl::Status JournalWriter::FlushClean() {
  {
    MutexLock lock(&mu_);
    if (!broken_.ok()) return BrokenError();
    EnqueueLocked(std::make_shared<const std::string>(EncodeCleanRecord()));
    clean_ = true;
  }
  return Flush();
}

absl::Status JournalWriter::status() const {
  MutexLock lock(&mu_);
  return broken_;
}

JournalWriterStats JournalWriter::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

absl::Status JournalWriter::CompactNow() {
  MutexLock lock(&mu_);
  if (!broken_.ok()) return BrokenError();
  // Served by a compaction that starts after this call (an automatic one
  // already running may not subsume what this caller accepted).
  const uint64_t mine = ++compact_asked_;
  work_cv_.Signal();
  while (broken_.ok() && compact_served_ < mine) durable_cv_.Wait(&mu_);
  if (!broken_.ok()) return BrokenError();
  if (compact_served_ok_) return absl::OkStatus();
  return absl::InternalError(
      "the journal's compaction failed; the old journal is still in use");
}

bool JournalWriter::ShouldCompact() const {
  const uint64_t threshold = std::max<uint64_t>(
      {options_.compaction_floor_bytes, next_compaction_min_,
       static_cast<uint64_t>(options_.compaction_ratio *
                             static_cast<double>(stats_.live_bytes))});
  return stats_.file_bytes > threshold;
}

void JournalWriter::Run() {
  if (options_.background) {
    // Low, not idle: the journal must keep up when every core is busy.
    RunAsBackgroundThread("host-tier journal writer", BackgroundClass::kLow);
  }
  // Explicit Lock/Unlock: the lock is released around every write.
  mu_.Lock();
  while (true) {
    while (broken_.ok() && !stop_ && pending_.empty() &&
           compact_served_ == compact_asked_) {
      work_cv_.Wait(&mu_);
    }
    if (!broken_.ok()) {
      while (!stop_) work_cv_.Wait(&mu_);  // Broken: idle until stopped.
      break;
    }
    if (compact_served_ != compact_asked_) {
      // This compaction starts after every CompactNow up to `asked` was
      // called: it subsumes what they had accepted.
      const uint64_t asked = compact_asked_;
      const int64_t done = stats_.compactions;
      Compact();  // Holds mu_ again on return.
      compact_served_ = asked;
      compact_served_ok_ = stats_.compactions > done;
      // A failed compaction signals nothing itself: wake CompactNow.
      durable_cv_.SignalAll();
      continue;
    }
    if (pending_.empty()) break;  // Stopped, and everything is written.
    // Gather a batch: until max_delay after its first record, unless it is
    // big enough, a Flush waits or the writer stops.
    const absl::Time deadline = first_pending_ + options_.max_delay;
    while (broken_.ok() && !stop_ && pending_bytes_ < options_.batch_bytes &&
           flush_seq_ <= durable_seq_) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      work_cv_.WaitWithTimeout(&mu_, left);
    }
    std::vector<std::shared_ptr<const std::string>> batch;
    batch.swap(pending_);
    const size_t batch_bytes = pending_bytes_;
    pending_bytes_ = 0;
    stats_.queued_bytes = 0;
    const uint64_t batch_seq = appended_seq_;
    const absl::Time batch_first = first_pending_;
    mu_.Unlock();
    // One contiguous buffer: one write, then one fdatasync.
    write_buffer_.clear();
    write_buffer_.reserve(batch_bytes);
    for (const auto& frame : batch) write_buffer_ += *frame;
    batch.clear();  // Drops the references outside the lock.
    absl::Status status = file_->Append(write_buffer_);
    if (status.ok()) status = file_->Sync();
    if (write_buffer_.capacity() > kMaxBufferBytes) {
      std::string().swap(write_buffer_);
    }
    mu_.Lock();
    if (!status.ok()) {
      Break(std::move(status));
      continue;
    }
    durable_seq_ = batch_seq;
    stats_.batch_lag.Add(absl::ToInt64Nanoseconds(absl::Now() - batch_first));
    published_lag_p50_ns_.store(stats_.batch_lag.QuantileNs(0.5),
                                std::memory_order_relaxed);
    published_lag_p99_ns_.store(stats_.batch_lag.QuantileNs(0.99),
                                std::memory_order_relaxed);
    published_lag_max_ns_.store(stats_.batch_lag.max_ns(),
                                std::memory_order_relaxed);
    ++stats_.batches;
    stats_.bytes_written += batch_bytes;
    stats_.file_bytes += batch_bytes;
    PublishLocked();
    durable_cv_.SignalAll();
    if (ShouldCompact()) Compact();
  }
  mu_.Unlock();
}

void JournalWriter::Compact() {
  // The live set reflects every record accepted so far, pending ones
  // included: the snapshot subsumes the pending buffer.
  std::vector<std::pair<uint64_t, Live>> entries;
  entries.reserve(live_.size());
  for (const auto& [id, entry] : live_) entries.emplace_back(id, entry);
  const bool clean = clean_;
  const uint64_t snapshot_seq = appended_seq_;
  std::vector<std::shared_ptr<const std::string>> subsumed;
  subsumed.swap(pending_);
  const size_t subsumed_bytes = pending_bytes_;
  pending_bytes_ = 0;
  stats_.queued_bytes = 0;
  mu_.Unlock();
  uint64_t bytes = 0;
  bool renamed = false;
  absl::StatusOr<std::unique_ptr<JournalFile>> file =
      WriteSnapshot(ParentsFirst(std::move(entries)), clean, &bytes, &renamed);
  if (file.ok()) file_ = *std::move(file);
  mu_.Lock();
  if (!file.ok() && renamed) {
    // The new file replaced the journal but its rename may not be durable,
    // and file_ now names the unlinked old one: nothing is safe to append.
    Break(file.status());
    return;
  }
  if (!file.ok()) {
    // The old journal is intact: put the subsumed records back in front.
    subsumed.insert(subsumed.end(), std::make_move_iterator(pending_.begin()),
                    std::make_move_iterator(pending_.end()));
    pending_.swap(subsumed);
    pending_bytes_ += subsumed_bytes;
    if (!pending_.empty()) first_pending_ = absl::Now();
    ++stats_.compaction_failures;
    next_compaction_min_ = stats_.file_bytes * 2;
    stats_.queued_bytes = pending_bytes_;
    return;
  }
  ++stats_.compactions;
  stats_.file_bytes = bytes;
  PublishLocked();
  next_compaction_min_ = 0;
  durable_seq_ = std::max(durable_seq_, snapshot_seq);
  PublishLocked();
  durable_cv_.SignalAll();
}

}  // namespace hicache::persist
