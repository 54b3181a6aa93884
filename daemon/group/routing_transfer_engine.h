#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/group/step_completer.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group {

// RoutingTransferEngine: the CP group leader's transfer engine
// (docs/cp-groups.md, "Wire format and remote transfers"), installed through
// EngineOptions::wrap_transfer. It splits each task's rank copies by the
// engine that serves the rank: the local backend engine for the leader's own
// ranks, a member's RemoteTransferEngine for the ranks that member serves.
//
// Contract:
//  * Routes: the local engine serves `local_ranks` for the engine's life;
//    SetRoute gives other ranks to an engine (a member that joined, or was
//    readmitted with a new engine) and ClearRoute takes them away. Every
//    engine reports to the same listener (the one given here), directly.
//  * Submit refuses (INVALID_ARGUMENT, nothing queued) a task naming a rank
//    twice or an unknown fence. It then submits the local part first: if
//    the first engine refuses its part, that error is returned and nothing
//    is queued. Every rank that is not served here afterwards completes
//    exactly once anyway: a rank without a route, or whose remote engine
//    refused its part (logged), completes with UNAVAILABLE (resp. that
//    engine's error) from the routing engine's completer thread, never
//    inside Submit.
//  * Fences route to the engine of their rank and get ids of the routing
//    engine's own (engines number theirs independently); a task's
//    wait_fence is translated back, and must have been registered for the
//    rank's current engine.
//  * Drain drains every engine routed to now, the local one and the
//    completer.
//  * The destructor destroys the local engine (and drops its references to
//    the remote ones) after draining the completer. The listener must
//    outlive it.
//
// Thread-safe. Lock order: mu_ is released before any engine is called;
// the completer's lock is taken under mu_ only to queue.
class RoutingTransferEngine final : public TransferEngine {
 public:
  // `listener` receives every completion (the local engine must have been
  // built with it too). `local` serves `local_ranks`.
  RoutingTransferEngine(TransferListener* listener,
                        std::unique_ptr<TransferEngine> local,
                        std::vector<Rank> local_ranks);
  ~RoutingTransferEngine() override;

  // Routes `ranks` to `engine` (replacing their previous route).
  // INVALID_ARGUMENT for a local rank or a null engine.
  absl::Status SetRoute(const std::vector<Rank>& ranks,
                        std::shared_ptr<TransferEngine> engine)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the route away: those ranks complete UNAVAILABLE from now on.
  void ClearRoute(const std::vector<Rank>& ranks) ABSL_LOCKS_EXCLUDED(mu_);

  TransferListener* listener() const { return listener_; }
  // Steps completed UNAVAILABLE because no engine served their rank, or
  // failed because a remote engine refused its part.
  int64_t unrouted_steps() const ABSL_LOCKS_EXCLUDED(mu_);

  // TransferEngine.
  absl::Status Submit(TransferTask task) override ABSL_LOCKS_EXCLUDED(mu_);
  void Drain() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseFence(uint64_t fence) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Fence {
    Rank rank;
    std::shared_ptr<TransferEngine> engine;
    uint64_t inner;  // The engine's own id.
  };

  // The engine serving `rank` now, or null.
  std::shared_ptr<TransferEngine> RouteLocked(Rank rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TransferListener* const listener_;
  const std::shared_ptr<TransferEngine> local_;
  const std::vector<Rank> local_ranks_;

  mutable Mutex mu_;
  absl::flat_hash_map<Rank, std::shared_ptr<TransferEngine>> routes_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Fence> fences_ ABSL_GUARDED_BY(mu_);
  uint64_t next_fence_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t unrouted_steps_ ABSL_GUARDED_BY(mu_) = 0;

  StepCompleter completer_;
};

}  // namespace hicache::group
