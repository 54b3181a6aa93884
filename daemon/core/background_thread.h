#pragma once

// Background work that must not slow the threads that serve.
//
// RunAsBackgroundThread: the calling thread asks the kernel to run it only
// when a CPU would otherwise be idle (SCHED_IDLE). A waking serving thread
// then preempts it at once, and it never competes with them for CPU time,
// only for what they leave; under a CPU that stays saturated it gets very
// little (the kernel still gives an idle-class thread a small share), so its
// work must be bounded and droppable. Falls back to nice 19 where SCHED_IDLE
// is refused (a seccomp or container policy); logs a warning naming `who`
// when neither can be set. There is no way back for an unprivileged thread.
//
// Such a thread must never hold a lock that a serving thread may wait for:
// preempted while holding it, it could keep the serving thread waiting for
// as long as the CPUs stay busy (no priority inheritance). BackgroundWorker
// is for that: a thread at the caller's priority does the locking and hands
// the heavy, lock-free part of its work to one in the background.

#include <thread>

#include "absl/functional/function_ref.h"
#include "daemon/core/mutex.h"

namespace hicache {

void RunAsBackgroundThread(const char* who);

// One background thread (RunAsBackgroundThread) that runs what it is handed
// and lets the caller wait for it. The work handed over must not take locks
// that serving threads take.
//
// Thread-safe; one Run at a time.
class BackgroundWorker {
 public:
  explicit BackgroundWorker(const char* who);
  // Stops the thread (after the Run in progress, if any).
  ~BackgroundWorker() ABSL_LOCKS_EXCLUDED(mu_);
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  // Runs `work` on the background thread; returns once it has returned.
  void Run(absl::FunctionRef<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop(const char* who) ABSL_LOCKS_EXCLUDED(mu_);

  Mutex mu_;
  CondVar cv_;
  const absl::FunctionRef<void()>* work_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hicache
