#pragma once

// The background writer of the host-tier journal (docs/hot-restart.md §3).
//
// Put() and Drop() never wait for I/O: the caller encodes the record (Put:
// also ValidatePut against the geometry), then, under a short lock, updates
// the in-memory live set and appends a pointer to the frame to the pending
// list (no bytes copied under the lock). One writer thread takes the whole
// pending list as a batch, copies it into one buffer outside the lock and
// makes it durable with one write and one fdatasync (group commit). A batch
// starts `max_delay` after its first record, or at once when `batch_bytes`
// are pending, a Flush() waits, or the writer stops.
//
// Back-pressure (the pending list holds `max_queue_bytes` of frames, not
// counting the batch being written, so the writer holds at most about twice
// that): a Put that does not fit is refused with RESOURCE_EXHAUSTED, at
// once, and nothing of it is recorded (that node just does not survive a
// restart; the engine may carry on). A Drop is never refused: it is 21
// bytes and losing it could resurrect a stale node, so Drops may exceed the
// bound.
//
// Failure: the first write, fdatasync or file error makes the journal broken
// for good. status() returns that error; Put/Drop/Flush return
// FAILED_PRECONDITION naming it; pending records are discarded and nothing
// more is written. The owner then carries on without persistence. Nothing
// crashes and nothing is dropped without a status saying so.
//
// Compaction: after a batch, when the file exceeds
// max(compaction_floor_bytes, compaction_ratio * live bytes), the writer
// thread snapshots the live set under the lock (pointers to encoded frames;
// the snapshot subsumes every pending record), writes header + Geometry +
// live Puts (parents first; Puts whose parent is not live last) + Clean if
// the last call was FlushClean to journal.tmp, fdatasyncs it, renames it over
// journal and fsyncs the directory, all outside the lock. A failed
// compaction leaves the old journal in use (the pending records are put
// back), is counted, and is not retried before the file doubles.
//
// Thread-safe. Records become durable in call order.
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/mutex.h"
#include "daemon/core/lag_histogram.h"
#include "daemon/persist/journal_format.h"
#include "daemon/persist/journal_fs.h"

namespace hicache::persist {

struct JournalWriterOptions {
  absl::Duration max_delay = absl::Milliseconds(10);
  size_t batch_bytes = size_t{1} << 20;
  size_t max_queue_bytes = size_t{256} << 20;
  uint64_t compaction_floor_bytes = uint64_t{64} << 20;
  double compaction_ratio = 2.0;
  JournalFs* fs = nullptr;  // nullptr: PosixJournalFs::Default().
  // The writer thread runs as a low-priority background thread
  // (RunAsBackgroundThread, BackgroundClass::kLow: nice 10): a small fair
  // share of a busy CPU, so it keeps up when every core is busy.
  bool background = true;
};

struct JournalWriterStats {
  int64_t puts = 0;            // Accepted.
  int64_t puts_refused = 0;    // RESOURCE_EXHAUSTED (queue full).
  int64_t drops = 0;           // Of live ids (written).
  int64_t unknown_drops = 0;   // Of ids not live: nothing to write.
  int64_t batches = 0;         // write + fdatasync pairs.
  uint64_t bytes_written = 0;  // By batches (compactions not included).
  int64_t compactions = 0;
  int64_t compaction_failures = 0;
  int64_t live_puts = 0;
  uint64_t live_bytes = 0;    // Encoded size of the live Puts.
  uint64_t file_bytes = 0;    // The journal's durable size.
  uint64_t queued_bytes = 0;  // Pending, not yet durable.
  // Per batch written: from its oldest record's acceptance to its sync.
  LagHistogram batch_lag;
};

class JournalWriter {
 public:
  // Starts writing <state_dir>/journal (the directory must exist; see
  // PrepareStateDir): writes header, Geometry and `live` (e.g.
  // LoadedJournal::puts, to continue after a load; empty for a fresh start)
  // to journal.tmp, makes it durable and renames it over any old journal.
  // The old journal's torn tail, orphans and dead records are thus gone.
  // INVALID_ARGUMENT for a geometry that fails ValidateGeometry or a live
  // Put that fails validation (or appears twice); file errors as
  // JournalFs returns them (the old journal is then left untouched).
  static absl::StatusOr<std::unique_ptr<JournalWriter>> Open(
      const std::string& state_dir, const JournalGeometry& geometry,
      const std::vector<PutRecord>& live, JournalWriterOptions options = {});

  // Makes everything accepted durable (unless broken), then stops the thread.
  // No other call may be in progress (or start) meanwhile. Writes no Clean
  // record: call FlushClean() first for a deliberate stop.
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;

  // Records a Put. INVALID_ARGUMENT if it fails EncodePutPayload or
  // ValidatePut against the geometry, or its persist_id is live already;
  // RESOURCE_EXHAUSTED when the queue is full (see above); FAILED_PRECONDITION
  // when broken. Returns once queued, not durable.
  absl::Status Put(const PutRecord& put);
  // Records that `persist_id` is gone. OK (and nothing written) if it is not
  // live. FAILED_PRECONDITION when broken.
  absl::Status Drop(uint64_t persist_id);
  // The tree split `persist_id` at token `at` (a page boundary inside it):
  // its first part becomes the live record `head_id` (its old parent, the
  // first pages and checksums), and `persist_id` keeps the rest, its parent
  // now `head_id`. Written as Drop(persist_id), Put(head), Put(rest), never
  // refused for a full queue (losing half of it would corrupt the index).
  // OK and nothing written if `persist_id` is not live; INVALID_ARGUMENT for
  // an `at` that is not a page boundary inside it, or a live `head_id`.
  // (journal_writer_reshape.cc)
  absl::Status Split(uint64_t persist_id, int64_t at, uint64_t head_id);
  // `child` now hangs from `parent` (which just got its host copy): written
  // as Drop(child), Put(child with the new parent); never refused for a
  // full queue. OK and nothing written if `child` is not live.
  absl::Status Reparent(uint64_t child, uint64_t parent);

  // Waits until everything accepted before the call is durable. OK, or
  // FAILED_PRECONDITION when broken (then it returns at once).
  absl::Status Flush();
  // Appends a Clean record (the daemon stops on purpose), then Flush().
  absl::Status FlushClean();
  // Compacts now, whatever the file's size (what is pending is subsumed),
  // and returns once the compaction is done: OK; the compaction's error
  // (the old journal is kept and stays in use); or FAILED_PRECONDITION when
  // the journal is broken. For tests and tools that must count a
  // compaction rather than wait for one.
  absl::Status CompactNow();

  // OK, or the error that broke the journal.
  absl::Status status() const;
  JournalWriterStats stats() const;
  // What GetStats and the metrics show, read without the journal's lock
  // (the writer may run in the background and be preempted holding it):
  // the live records, the durable file size, whether it broke, and the
  // records accepted that are not durable yet (0: everything accepted so
  // far is on disk).
  struct Summary {
    int64_t live_puts = 0;
    uint64_t file_bytes = 0;
    bool broken = false;
    uint64_t not_durable_records = 0;
    // JournalWriterStats::batch_lag's p50, p99 and max.
    int64_t batch_lag_p50_ns = 0;
    int64_t batch_lag_p99_ns = 0;
    int64_t batch_lag_max_ns = 0;
  };
  Summary summary() const;
  const JournalGeometry& geometry() const { return geometry_; }

 private:
  struct Live {
    uint64_t parent = 0;
    std::shared_ptr<const std::string> frame;
  };

  JournalWriter(std::string state_dir, JournalGeometry geometry,
                JournalWriterOptions options);

  // Writes header + Geometry + frames (+ Clean) to journal.tmp and renames it
  // over journal; returns the new file on success. *renamed tells whether
  // the rename happened (on error: the journal may be the new file).
  absl::StatusOr<std::unique_ptr<JournalFile>> WriteSnapshot(
      const std::vector<Live>& ordered, bool clean, uint64_t* bytes,
      bool* renamed);
  static std::vector<Live> ParentsFirst(
      std::vector<std::pair<uint64_t, Live>> entries);
  void Run();
  // The live record of `persist_id`, decoded (nullopt if not live).
  std::optional<PutRecord> LiveRecordLocked(uint64_t persist_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops each of `drops` (live) and puts each of `puts` (already
  // validated), appending their frames in that order; past the queue bound.
  absl::Status ReplaceLocked(absl::Span<const uint64_t> drops,
                             absl::Span<const PutRecord> puts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends `frame` to the pending records (one more sequence number) and
  // wakes the writer if it needs it (a batch's first record, or batch_bytes
  // reached).
  void EnqueueLocked(std::shared_ptr<const std::string> frame)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Compact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Break(absl::Status cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status BrokenError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ShouldCompact() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies what summary() reads from stats_ and broken_.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string state_dir_;
  const JournalGeometry geometry_;
  const JournalWriterOptions options_;
  JournalFs* const fs_;
  std::string geometry_frame_;

  // Only the writer thread (and Open, before it starts) touches the file
  // and the batch buffer (reused while it stays under kMaxBufferBytes).
  std::unique_ptr<JournalFile> file_;
  std::string write_buffer_;
  static constexpr size_t kMaxBufferBytes = size_t{8} << 20;

  mutable Mutex mu_;
  CondVar work_cv_;     // Writer: records pending, flush wanted, stop.
  CondVar durable_cv_;  // Flush waiters: durable_seq_ advanced or broken.
  absl::flat_hash_map<uint64_t, Live> live_ ABSL_GUARDED_BY(mu_);
  // Frames accepted and not yet taken by the writer, in order (a Put's
  // frame is shared with live_: enqueueing copies no bytes).
  std::vector<std::shared_ptr<const std::string>> pending_ ABSL_GUARDED_BY(mu_);
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_pending_ ABSL_GUARDED_BY(mu_);
  uint64_t appended_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t flush_seq_ ABSL_GUARDED_BY(mu_) = 0;  // Highest seq a Flush wants.
  bool clean_ ABSL_GUARDED_BY(mu_) = false;      // Last call was FlushClean.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t next_compaction_min_ ABSL_GUARDED_BY(mu_) = 0;
  // CompactNow(): the generation asked for, the last one the writer ran a
  // compaction for, and whether that compaction succeeded.
  uint64_t compact_asked_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t compact_served_ ABSL_GUARDED_BY(mu_) = 0;
  bool compact_served_ok_ ABSL_GUARDED_BY(mu_) = false;
  JournalWriterStats stats_ ABSL_GUARDED_BY(mu_);
  // summary(): written under mu_ (PublishLocked), read without it.
  std::atomic<int64_t> published_live_puts_{0};
  std::atomic<uint64_t> published_file_bytes_{0};
  std::atomic<bool> published_broken_{false};
  std::atomic<uint64_t> published_not_durable_{0};
  std::atomic<int64_t> published_lag_p50_ns_{0};  // After each batch.
  std::atomic<int64_t> published_lag_p99_ns_{0};
  std::atomic<int64_t> published_lag_max_ns_{0};

  std::thread thread_;
};

}  // namespace hicache::persist
