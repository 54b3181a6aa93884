#pragma once

// Records the radix tree's host-tier changes in the durable journal
// (docs/hot-restart.md §4–§5): the engine's HostTierListener.
//
// The tree reports under the engine's lock; the recorder only copies the
// event into an ordered queue and returns. One worker thread takes events in
// order: a commit's page checksums are computed there, off the engine lock,
// and the record (the index only, no tokens) goes to the journal writer
// (which makes it durable in the background); drops, splits and reparents go
// straight through. The only work under the engine's lock is copying the
// event and the node's key into its pages' PageKeyStore slots (one page of
// tokens each, as the KV copy is one page of bytes each).
//
// Why checksums computed later are still right: a committed host page is
// never written again while its node holds it, and the tree reports a drop
// before the engine frees the pages. So the worker hashes first, then checks
// (under the recorder's lock) whether the node was dropped since its commit
// was queued: if it was, the hash may cover reused bytes and the Put is
// discarded; if it was not, the hash was taken while the pages were still
// the node's. A page reused by another node can never verify for this one.
// Keys: a slot is written at commit, in the tree's order, so it holds the
// key of the last node committed with that page; the worker hashes it with
// the KV bytes, under the same dropped-meanwhile check. A slot that holds
// another node's key at recovery (a crash before a Drop became durable)
// fails the recorded checksum, as reused KV bytes do.
//
// The journal failing (a full disk) or refusing a Put (its queue is full)
// never stops the cache: the node just does not survive a restart, and
// stats() counts it.
//
// Thread-safe. The listener methods must be called in the tree's order.

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/mutex.h"
#include "daemon/persist/journal_writer.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/radix/host_tier_listener.h"

namespace hicache {

struct HostTierRecorderStats {
  int64_t puts = 0;            // Handed to the journal.
  int64_t puts_discarded = 0;  // Dropped before their checksums were taken.
  // Not recorded: the recorder's queue (max_queued_pages) or the journal's
  // was full.
  int64_t puts_refused = 0;
  int64_t journal_errors = 0;  // Calls that failed otherwise (broken).
  int64_t events = 0;          // Everything the worker has handled.
  uint64_t hashed_bytes = 0;   // Host page bytes checksummed.
};

class HostTierRecorder final : public HostTierListener {
 public:
  // One host pool per served rank: the bytes the checksums read.
  struct HostPool {
    Rank rank = 0;
    absl::Span<const uint8_t> bytes;
  };
  struct Options {
    KvGeometry geometry;
    HostLayout layout = HostLayout::kLayerFirst;
    int64_t host_pages_per_rank = 0;
    std::vector<HostPool> pools;  // Every rank of the journal's geometry.
    persist::JournalWriter* journal = nullptr;  // Not owned; outlives this.
    PageKeyStore* keys = nullptr;  // Not owned; outlives this.
    // The worker takes events in batches: it is woken when wake_batch are
    // queued, else it takes them max_delay after the first (or at a Flush).
    size_t wake_batch = 64;
    absl::Duration max_delay = absl::Milliseconds(5);
    // The worker's nice level (0: the daemon's own priority). Lower
    // priority keeps hashing off the serving threads' CPU under contention.
    int worker_nice = 10;
    // Commits waiting to be hashed, in pages: past this bound a commit is
    // not recorded (its node does not survive a restart; puts_refused), so
    // a recorder that falls behind never holds unbounded memory.
    int64_t max_queued_pages = int64_t{1} << 22;
    // Test seam: the worker calls it before handling each event.
    std::function<void()> before_event;
  };

  explicit HostTierRecorder(Options options);
  // Handles every queued event, then stops the worker.
  ~HostTierRecorder() override;
  HostTierRecorder(const HostTierRecorder&) = delete;
  HostTierRecorder& operator=(const HostTierRecorder&) = delete;

  // HostTierListener (under the engine's lock; never blocks on I/O).
  void OnHostCommitted(HostCommit& commit) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnHostReparented(uint64_t child, uint64_t parent) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnHostDropped(uint64_t persist_id) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnHostSplit(uint64_t persist_id, int64_t at,
                   uint64_t head_persist_id) override ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every event reported before the call has reached the
  // journal (later ones do not delay it), then
  // makes the journal durable (FlushClean when `clean`: the daemon stops on
  // purpose). The journal's status.
  absl::Status Flush(bool clean = false) ABSL_LOCKS_EXCLUDED(mu_);

  HostTierRecorderStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Event {
    enum class Kind { kPut, kDrop, kSplit, kReparent } kind = Kind::kPut;
    persist::PutRecord put;  // kPut: everything but the checksums.
    bool key_stored = false;  // kPut: its slots hold its key.
    // kPut, set by the worker: its checksums were taken and it was not
    // dropped meanwhile (else it is discarded); the bytes hashed.
    bool recordable = false;
    uint64_t hashed_bytes = 0;
    uint64_t id = 0;         // kDrop, kSplit: the node; kReparent: the child.
    uint64_t other = 0;      // kSplit: the head; kReparent: the parent.
    int64_t at = 0;          // kSplit: the token it split at.
  };

  // Events the worker handles (hashes, checks, journals, counts) at once.
  static constexpr size_t kMaxBatch = 1024;
  // Handled Puts kept for the next commits to refill (their vectors keep
  // their capacity): steady traffic allocates nothing per commit.
  static constexpr size_t kMaxSparePuts = 256;

  void Enqueue(Event event) ABSL_LOCKS_EXCLUDED(mu_);
  void EnqueueLocked(Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // What a batch's journal calls came to, added to stats_ once a batch.
  struct Tally {
    int64_t puts = 0;
    int64_t puts_refused = 0;
    int64_t journal_errors = 0;
    absl::Status first_error;
  };
  // Takes a batch's checksums (no lock), decides under one lock which of
  // its Puts are recorded, hands the batch to the journal in order (no
  // lock), then counts it.
  void HandleBatch(absl::Span<Event> batch) ABSL_LOCKS_EXCLUDED(mu_);
  // The journal call for one event (a Put only if recordable).
  void Handle(const Event& event, Tally* tally) const;
  // Fills put->checksums with the pages' KV checksums; false if a page
  // cannot be read (a bad record).
  bool Checksum(persist::PutRecord* put, uint64_t* bytes) const;
  // Mixes each page's slot tokens into its checksum (PageRecordChecksum);
  // false if a slot cannot be read.
  bool MixKeyChecksums(persist::PutRecord* put) const;
  static void Count(const absl::Status& status, bool put, Tally* tally);

  const Options options_;

  mutable Mutex mu_;
  CondVar work_cv_;  // The worker: events queued or stop.
  CondVar idle_cv_;  // Flush: the worker handled more events.
  // In order. A vector that the worker swaps with its emptied batch, so
  // that queueing allocates nothing once both have grown.
  std::vector<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<persist::PutRecord> spare_puts_ ABSL_GUARDED_BY(mu_);
  bool worker_waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int flush_wanted_ ABSL_GUARDED_BY(mu_) = 0;  // Flush calls waiting.
  int64_t queued_pages_ ABSL_GUARDED_BY(mu_) = 0;  // Of queued commits.
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;  // Events queued, ever.
  int64_t handled_ ABSL_GUARDED_BY(mu_) = 0;   // Events handled, ever.
  absl::Time first_queued_ ABSL_GUARDED_BY(mu_);  // Of the queued batch.
  // Commits queued or being hashed, and those of them dropped meanwhile.
  absl::flat_hash_set<uint64_t> unrecorded_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> dropped_early_ ABSL_GUARDED_BY(mu_);
  HostTierRecorderStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace hicache
