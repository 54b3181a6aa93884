#pragma once

// Records the radix tree's host-tier changes in the durable journal
// (docs/hot-restart.md §4–§5): the engine's HostTierListener.
//
// The tree reports under the engine's lock; the recorder only queues the
// event and returns: nothing is copied or hashed there. A commit's key stays
// in the tree's token blocks, which the tree keeps from reuse (HoldsKeys,
// KeysReadThrough) until the worker has read it. One worker thread handles
// the events in order, each once it has been queued for `settle`: a node
// dropped within that window (on a churning host tier, most of them) costs
// no copy, no hash and no journal record. For a commit still live, the worker
// copies its key into its pages' PageKeyStore slots (one page of tokens
// each, as the KV copy is one page of bytes each), computes its page
// checksums, off the engine lock, and hands the record (the index only, no
// tokens) to the journal writer, which makes it durable in the background;
// drops, splits and reparents go straight through.
//
// Why checksums computed later are still right: a committed host page is
// never written again while its node holds it, and the tree reports a drop
// before the engine frees the pages. So the worker hashes first, then takes
// what was queued meanwhile and checks whether the node, or a head split off
// it since (a head holds some of its pages), was dropped since its commit
// was queued: if so, the hash may cover reused bytes there, and only the
// parts before the first dropped one are recorded (their pages were never
// freed), each as a record of its own, or nothing; if not, the hash was
// taken while the pages were still the node's. A page reused by another
// node can never verify for this one.
// That check needs no lock shared with the engine's threads: the worker
// reads the drops from the queue itself.
// Keys: only the worker writes slots, in the tree's order (a commit that
// reuses a page comes after the drop that freed it, so its key is written
// after, and before its record is journaled), so a slot holds the key of the
// last node committed with that page and handled. The worker hashes the
// tokens it wrote with the KV bytes, under the same dropped-meanwhile check.
// A slot that holds another node's key at recovery (a crash before a Drop
// became durable) fails the recorded checksum, as reused KV bytes do.
//
// The journal failing (a full disk) or refusing a Put (its queue is full)
// never stops the cache: the node just does not survive a restart, and
// stats() counts it. A crash loses the commits of the last `settle` (and the
// journal's own batch), which a restart then finds free.
//
// Thread-safe. The listener methods must be called in the tree's order.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/background_thread.h"
#include "daemon/core/mutex.h"
#include "daemon/core/lag_histogram.h"
#include "daemon/persist/journal_writer.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/radix/host_tier_listener.h"

namespace hicache {

struct HostTierRecorderStats {
  int64_t puts = 0;            // Handed to the journal.
  int64_t puts_discarded = 0;  // Dropped before their checksums were taken.
  // A part dropped before their checksums were taken: recorded as the parts
  // before it (one record each, counted in puts).
  int64_t puts_cut = 0;
  // Not recorded: the recorder's queue (max_queued_pages) or the journal's
  // was full.
  int64_t puts_refused = 0;
  int64_t journal_errors = 0;  // Calls that failed otherwise (broken).
  int64_t events = 0;          // Everything the worker has handled.
  // Not queued: the recorder had overrun max_queued_events.
  int64_t events_refused = 0;
  uint64_t hashed_bytes = 0;   // Host page bytes checksummed.
  // Reported and not handled yet (settling, or waiting for the worker).
  int64_t backlog_events = 0;
  // Each event's time from its report to its hand-over to the journal
  // (the settle window included).
  LagHistogram lag;
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
    // An event is handled once it has been queued this long (at once at a
    // Flush or at destruction): how long a commit may be dropped again
    // before it costs a key copy, checksums and a record.
    absl::Duration settle = absl::Milliseconds(20);
    // The worker wakes when its oldest event has settled for this much
    // longer, and handles every settled event then: a batch at most every
    // `batch_delay`, not a wake-up an event.
    absl::Duration batch_delay = absl::Milliseconds(5);
    // The worker's heavy part (key copies, checksums, journal calls) runs on
    // a background thread (BackgroundWorker: only on CPU time the serving
    // threads leave); the worker itself, which shares a lock with them,
    // keeps the daemon's priority. false: all of it at the daemon's.
    bool background = true;
    // Commits waiting to be hashed, in pages: past this bound a commit is
    // not recorded (its node does not survive a restart; puts_refused), so
    // a recorder that falls behind never holds unbounded memory.
    int64_t max_queued_pages = int64_t{1} << 22;
    // Events (commits, drops, splits, reparents) not handled yet: past this
    // bound the recorder stops recording for good (events_refused; every
    // commit not journaled yet is discarded, as one whose later events are
    // lost could be hashed over reused pages), so that a worker starved
    // for CPU never holds unbounded memory.
    int64_t max_queued_events = int64_t{1} << 20;
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
  bool HoldsKeys() const override { return true; }
  uint64_t KeysReadThrough() const override {
    return keys_read_through_.load(std::memory_order_acquire);
  }
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
  // A commit: its record and where its key is (the tree's blocks, kept
  // from reuse until KeysReadThrough passes the commit).
  struct Put {
    persist::PutRecord record;  // Everything but the checksums.
    std::vector<TokenStore::BlockId> key_blocks;
    const TokenStore* tokens = nullptr;
    // Set by the worker when a part of the commit (split off it since) was
    // dropped before it was recorded: the parts from its first token up to
    // the first dropped one, each a record of its own, recorded instead of
    // `record` (their pages were never freed; the rest may have been).
    std::vector<persist::PutRecord> parts;
  };
  struct Event {
    enum class Kind { kPut, kDrop, kSplit, kReparent } kind = Kind::kPut;
    Put put;  // kPut.
    int64_t queued_ns = 0;  // When it was queued (steady clock).
    uint64_t call = 0;      // Its number among the listener calls, from 1.
    // kPut, set by the worker: its checksums were taken and it was not
    // dropped meanwhile (else it is discarded); the bytes hashed.
    bool recordable = false;
    uint64_t hashed_bytes = 0;
    // kSplit, set by the worker: its head was recorded as a part of the
    // commit it was split off (Put::parts), so the split is not journaled.
    bool recorded_as_part = false;
    uint64_t id = 0;         // kDrop, kSplit: the node; kReparent: the child.
    uint64_t other = 0;      // kSplit: the head; kReparent: the parent.
    int64_t at = 0;          // kSplit: the token it split at.
  };

  // Events the worker handles (hashes, checks, journals, counts) at once.
  static constexpr size_t kMaxBatch = 1024;
  // Handled Puts kept for the next commits to refill (their vectors keep
  // their capacity): steady traffic allocates nothing per commit.
  static constexpr size_t kMaxSparePuts = 256;

  // False if not queued (the recorder has overrun).
  bool Enqueue(Event event) ABSL_LOCKS_EXCLUDED(mu_);
  bool EnqueueLocked(Event event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // What a batch came to, added to stats_ once a batch.
  struct Tally {
    int64_t puts = 0;
    int64_t puts_discarded = 0;
    int64_t puts_cut = 0;
    LagHistogram lag;
    int64_t puts_refused = 0;
    int64_t journal_errors = 0;
    uint64_t hashed_bytes = 0;
    int64_t pages = 0;  // Of the batch's Puts (queued_pages_ goes down).
    absl::Status first_error;
  };
  // Takes a batch's keys and checksums (no lock), takes what was queued
  // meanwhile (one swap) to learn which of its Puts were dropped, hands the
  // batch to the journal in order (no lock), then counts it.
  void HandleBatch(absl::Span<Event> batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Worker only: moves the queue into *arrived (one swap under the lock)
  // and notes what it says about the Puts not handled yet. True once the
  // recorder has overrun (max_queued_events): nothing may be recorded.
  bool TakeQueue(std::vector<Event>* arrived) ABSL_LOCKS_EXCLUDED(mu_);
  // Worker only: what one taken event says about the pending Puts.
  void Track(const Event& event);
  // Worker only: the parts of pending commit `root` (itself and the heads
  // split off it), by first token, up to the first one dropped.
  struct Part {
    uint64_t id = 0;
    int64_t start = 0;  // Tokens of the commit's record.
    int64_t end = 0;
  };
  std::vector<Part> SurvivingParts(uint64_t root) const;
  // SurvivingParts(root) is not empty: its part at token 0 is not dropped
  // (no allocation: most dropped commits have nothing to record).
  bool FirstPartSurvives(uint64_t root) const;
  // `whole` (checksums taken) cut into records of `parts`, each the child
  // of the one before (the first keeps whole's parent).
  static std::vector<persist::PutRecord> CutIntoParts(
      const persist::PutRecord& whole, uint64_t first_parent,
      const std::vector<Part>& parts, int64_t page_size);
  // Runs `work` on hasher_ (in the background) if there is one, else here.
  void InBackground(absl::FunctionRef<void()> work);
  // The journal call for one event (a Put only if recordable).
  void Handle(const Event& event, Tally* tally) const;
  // Writes the key into its pages' slots, then fills the record's
  // checksums: each page's KV bytes mixed with its tokens
  // (PageRecordChecksum). False for a record that cannot be (a bad page).
  bool StoreKeyAndChecksum(Put* put, uint64_t* bytes);
  static void Count(const absl::Status& status, bool put, Tally* tally);

  const Options options_;

  // Guards the hand-over between the engine's threads and the worker only:
  // every section under it is O(1) (a push, a swap, a few counters), so a
  // report made under the engine's lock never waits for the worker's work.
  mutable Mutex mu_;
  CondVar work_cv_;  // The worker: events queued or stop.
  CondVar idle_cv_;  // Flush: the worker handled more events.
  // In order. A vector that the worker swaps with an emptied one, so that
  // queueing allocates nothing once both have grown.
  std::vector<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<Put> spare_puts_ ABSL_GUARDED_BY(mu_);
  uint64_t calls_ ABSL_GUARDED_BY(mu_) = 0;  // Listener calls, ever.
  // KeysReadThrough(): the worker stores the call number of the last event
  // of each batch it has handled (release), the tree loads it (acquire)
  // before it reuses a block.
  std::atomic<uint64_t> keys_read_through_{0};
  // The worker waits with nothing queued or settling: the next event must
  // wake it (otherwise it wakes on its own when the oldest has settled).
  bool worker_empty_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int flush_wanted_ ABSL_GUARDED_BY(mu_) = 0;  // Flush calls waiting.
  int64_t queued_pages_ ABSL_GUARDED_BY(mu_) = 0;  // Of unhandled commits.
  bool overrun_ ABSL_GUARDED_BY(mu_) = false;  // See max_queued_events.
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;  // Events queued, ever.
  int64_t handled_ ABSL_GUARDED_BY(mu_) = 0;   // Events handled, ever.
  HostTierRecorderStats stats_ ABSL_GUARDED_BY(mu_);

  // The worker thread's own (no lock). Every taken Put not handled yet, and
  // the heads split off it since (their pages are some of its pages), each
  // mapped to that Put's id and its tokens there; the Puts of which some
  // part was dropped since their commit (those pages may be reused, so
  // their checksums cannot be trusted: only the parts before the first
  // dropped one are recorded), and the parts dropped; what the worker took
  // while a batch was being handled; and what it hands back to the
  // engine's threads in one swap.
  struct Segment {
    uint64_t root = 0;  // The Put it is a part of.
    int64_t start = 0;  // Its tokens in that Put's record.
    int64_t end = 0;
  };
  absl::flat_hash_map<uint64_t, Segment> pending_;
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> heads_;
  absl::flat_hash_set<uint64_t> dropped_;
  absl::flat_hash_set<uint64_t> dropped_parts_;  // Ids, of pending_'s.
  // A pending Put's first part reparented since its commit: its new parent
  // (a cut records that part with it; the journal would ignore the
  // Reparent of an id it does not hold).
  absl::flat_hash_map<uint64_t, uint64_t> first_parent_;
  // Heads recorded as parts whose split event is not handled yet.
  absl::flat_hash_set<uint64_t> recorded_heads_;
  std::vector<Event> arrived_;
  std::vector<Event> taken_;  // Swapped with the queue; keeps a capacity.
  std::vector<Put> spares_;
  std::vector<absl::Span<const int32_t>> key_pages_;  // Reused per Put.
  // Options::background: the thread that hashes and calls the journal.
  std::unique_ptr<BackgroundWorker> hasher_;
  std::thread worker_;
};

}  // namespace hicache
