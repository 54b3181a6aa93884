#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/core/mutex.h"

namespace hicache {

// Promotions from the storage tier off the caller's thread (the prefetch
// policies of docs/storage-tier.md §1): Start queues one and returns at
// once; Wait waits for it for as long as the policy allows. One thread runs
// them in order. A promotion of the same namespace and tokens already
// queued or running is not queued twice (Start returns its id).
//
// Thread-safe. The promotion function must be callable until the
// destructor returns.
class StoragePrefetcher {
 public:
  // Promotes what the stores hold of `tokens`' continuation; returns the
  // tokens promoted.
  using Promote = std::function<int64_t(absl::string_view ns,
                                        absl::Span<const int32_t> tokens)>;
  struct Stats {
    int64_t started = 0;       // Queued.
    int64_t deduplicated = 0;  // Start found the same one queued or running.
    int64_t dropped = 0;       // Not queued: `max_queued` were waiting.
    int64_t completed = 0;
    int64_t waits_timed_out = 0;
  };

  StoragePrefetcher(Promote promote, int max_queued);
  // Finishes the promotion running, drops the queued ones, and stops.
  ~StoragePrefetcher() ABSL_LOCKS_EXCLUDED(mu_);
  StoragePrefetcher(const StoragePrefetcher&) = delete;
  StoragePrefetcher& operator=(const StoragePrefetcher&) = delete;

  // Queues a promotion; its id, or 0 when the queue was full (dropped).
  uint64_t Start(absl::string_view ns, absl::Span<const int32_t> tokens)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The tokens promotion `id` promoted once it has finished, waiting at most
  // `timeout` (zero: not at all; absl::InfiniteDuration(): until it has);
  // nullopt if it has not finished by then (or `id` is unknown: finished
  // results are kept for the last 1,024 promotions).
  std::optional<int64_t> Wait(uint64_t id, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until nothing is queued or running (tests and the replay's
  // deterministic mode).
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    uint64_t id;
    uint64_t fingerprint;
    std::string ns;
    std::vector<int32_t> tokens;
  };

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const Promote promote_;
  const int max_queued_;
  mutable Mutex mu_;
  CondVar cv_;  // Queued, finished, or stopping.
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  // Queued or running, by fingerprint of (ns, tokens) -> id.
  absl::flat_hash_map<uint64_t, uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int64_t> finished_ ABSL_GUARDED_BY(mu_);  // id -> tokens
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace hicache
