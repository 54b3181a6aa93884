// EventCounter of //fuzz:service_fuzzer: the engine's listener, in front of
// the EventHub.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache::fuzz {

// Backup events per operation, counted on their way from the engine to the
// hub (the engine's listener is this counter, which hands every event on to
// the EventHub, as DaemonServer's engine reports to its hub directly). A
// BackupStream's mailbox receives exactly the events of the operations it
// prepared -- those queued in the hub before its claim and those after -- and
// the counter sees each event before the hub delivers it. So when a stream's
// count is above the events its NextEvent returned, one is in the mailbox or
// being put there: NextEvent, which blocks, is called only then, and the
// fuzzer drains every stream on its own thread without ever blocking for good.

class EventCounter final : public EngineListener {
 public:
  explicit EventCounter(EngineListener* next) : next_(next) {}

  void OnOpEvent(const OpEvent& event) override {
    const bool backup = event.type == OpEvent::Type::kBackupStep ||
                        event.type == OpEvent::Type::kCommitted ||
                        event.type == OpEvent::Type::kRolledBack;
    if (backup) Count(event.op);
    next_->OnOpEvent(event);
  }

  // Backup events of `ops` so far.
  int64_t Events(const std::set<uint64_t>& ops) const {
    MutexLock lock(&mu_);
    return SumLocked(ops);
  }

  // Waits until more than `seen` backup events of `ops` came, or until
  // `deadline`; returns whether they did.
  bool AwaitMore(const std::set<uint64_t>& ops, int64_t seen,
                 absl::Time deadline) const {
    MutexLock lock(&mu_);
    while (SumLocked(ops) <= seen) {
      if (cv_.WaitWithTimeout(&mu_, deadline - absl::Now())) {
        return SumLocked(ops) > seen;
      }
    }
    return true;
  }

 private:
  void Count(uint64_t op) {
    MutexLock lock(&mu_);
    ++counts_[op];
    cv_.SignalAll();
  }
  int64_t SumLocked(const std::set<uint64_t>& ops) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t sum = 0;
    for (uint64_t op : ops) {
      auto it = counts_.find(op);
      if (it != counts_.end()) sum += it->second;
    }
    return sum;
  }

  EngineListener* const next_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  absl::flat_hash_map<uint64_t, int64_t> counts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::fuzz
