#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"

namespace hicache {

// Source of the current time. Components that measure durations (uptime,
// leases, pin expiry) take a Clock so tests can control time.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // A process-wide real clock. Never null; never destroyed.
  static Clock* Real();
};

// The wall clock.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that only moves when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    now_ += d;
  }
  void Set(absl::Time t) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    now_ = t;
  }

 private:
  mutable Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
