#pragma once

// hicache::Mutex: the mutex every hicached component uses.
//
// Why not absl::Mutex directly: Debian's Abseil is a prebuilt shared library
// without ThreadSanitizer annotations, so TSan cannot see the happens-before
// edges of absl::Mutex and would report false races (or miss real ones). This
// wrapper sits on std::shared_mutex (pthread rwlock), which TSan intercepts,
// and carries Abseil's thread-safety attributes, so clang's -Wthread-safety
// checks ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED against it.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace hicache {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return mu_.try_lock();
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

  // Documents (and tells the analysis) that the caller holds the lock.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

 private:
  friend class CondVar;
  std::shared_mutex mu_;
};

// Holds `mu` exclusively for the scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Holds `mu` shared for the scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->ReaderLock();
  }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Condition variable for hicache::Mutex (exclusive holders only).
class CondVar {
 public:
  // REQUIRES: `mu` held exclusively. Atomically releases it while waiting.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::shared_mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // As Wait(); returns true if `timeout` elapsed without a signal. A timeout
  // of a year or more (absl::InfiniteDuration() included) waits without one:
  // the clock arithmetic of wait_for would overflow and return at once.
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (timeout >= absl::Hours(24 * 365)) {
      Wait(mu);
      return false;
    }
    std::unique_lock<std::shared_mutex> lock(mu->mu_, std::adopt_lock);
    const std::cv_status status =
        cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout));
    lock.release();
    return status == std::cv_status::timeout;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

}  // namespace hicache
