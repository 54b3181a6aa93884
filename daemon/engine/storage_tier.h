#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/core/clock.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/mutex.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/radix/cp_host_meta.h"
#include "daemon/storage/page_store.h"
#include "daemon/storage/store_key.h"

namespace hicache {

// The engine's side of the storage tier (L3, docs/storage-tier.md): which
// store holds which rank's pages, the keys of a sequence's pages, copies of
// committed host pages into the stores, and reads of stored pages into host
// pages.
//
// Each CP rank writes the pages it owns (its host pages) to its own store
// and reads pages into its own host pool; `stores` may name one store for
// every rank (a shared store). A page is stored under its StoreKey, chained
// over the layout fingerprint (KvGeometry::HostFingerprint at page-first
// layout, which covers the geometry, the page size and cp_size), the
// namespace and the tokens, so the same prefix has the same keys on every
// rank and every daemon of that layout.
//
// Writes are asynchronous: Write gathers the pages' bytes (under the
// engine's lock, when they cannot change) and a writer thread of this class
// hands them to the stores. Queued bytes are bounded; beyond the bound a
// write is dropped and counted, never waited for.
//
// Thread-safe. The stores and the pools must outlive it.
class StorageTier {
 public:
  struct Options {
    std::vector<PageStore*> stores;  // One per CP rank (cp_size entries).
    int64_t max_queued_bytes = int64_t{256} << 20;
    // Times reads for the bandwidth estimate (ReadNsPerByte). Not owned;
    // nullptr: the real clock.
    const Clock* clock = nullptr;
  };
  struct Stats {
    int64_t pages_queued = 0;   // Pages handed to the writer.
    int64_t pages_dropped = 0;  // Writes dropped: the queue was full.
    int64_t pages_written = 0;  // Stored (or already there).
    int64_t write_errors = 0;
    int64_t pages_read = 0;     // Read into host pages intact.
    int64_t read_failures = 0;  // Misses, checksum failures, I/O errors.
  };

  StorageTier(Options options, const CpLayout& layout,
              const KvGeometry& geometry, const RankPools& pools);
  // Writes what is queued, then stops.
  ~StorageTier() ABSL_LOCKS_EXCLUDED(mu_);
  StorageTier(const StorageTier&) = delete;
  StorageTier& operator=(const StorageTier&) = delete;

  uint64_t layout_fingerprint() const { return fingerprint_; }

  // Keys of whole pages [first, end) of `tokens` in `ns` (end clipped to
  // the whole pages there are; empty when none is left).
  std::vector<StoreKey> Keys(absl::string_view ns,
                             absl::Span<const int32_t> tokens, int64_t first,
                             int64_t end) const;

  // Queues the whole pages of a committed host copy for the stores:
  // page i of `host` under keys[i], from its owner's host pool to its
  // owner's store. keys.size() <= host.num_pages() (a partial last page has
  // no key and is not written). REQUIRES the host pages not change during
  // the call (the engine's lock).
  void Write(const CpHostMeta& host, absl::Span<const StoreKey> keys)
      ABSL_LOCKS_EXCLUDED(mu_);

  // For each key, the index (in Options::stores order) of the first store
  // that holds it, or -1. One Exists batch per distinct store.
  std::vector<int> Holders(absl::Span<const StoreKey> keys) const;
  // Holders of the leading keys some store holds; stops at the first key no
  // store holds.
  std::vector<Rank> Present(absl::Span<const StoreKey> keys) const;

  // Reads page i (keys[i], from store sources[i]) into host page
  // host_pages[i] of rank owners[i]. Blocks for the I/O: call without the
  // engine's lock, with the host pages reserved by the caller. Returns how
  // many leading pages arrived intact (a miss, a checksum failure or an I/O
  // error ends the run).
  int64_t Read(absl::Span<const StoreKey> keys, absl::Span<const Rank> sources,
               absl::Span<const Rank> owners,
               absl::Span<const int64_t> host_pages) ABSL_LOCKS_EXCLUDED(mu_);

  // The measured cost of reading from the stores, nanoseconds per byte
  // (the whole Read call over its bytes, averaged with weight 1/8 for the
  // newest read); 0 before the first read.
  double ReadNsPerByte() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every queued write has reached its store (tests, replay's
  // deterministic mode, shutdown).
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The stores' own counters, summed over distinct stores.
  PageStoreStats StoreStats() const;
  // Distinct stores, described.
  std::vector<std::string> Describe() const;

 private:
  struct Job {
    Rank store;
    StoreKey key;
    std::vector<uint8_t> bytes;
  };

  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<PageStore*> DistinctStores() const;

  const Options options_;
  const CpLayout layout_;
  const KvGeometry geometry_;
  const RankPools& pools_;
  const uint64_t fingerprint_;
  mutable Mutex mu_;
  CondVar cv_;  // Jobs queued, jobs done, or stopping.
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t writing_ ABSL_GUARDED_BY(mu_) = 0;  // Jobs taken, not finished.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  double read_ns_per_byte_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread writer_;
};

}  // namespace hicache
