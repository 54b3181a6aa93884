#pragma once

// Background work that must not slow the threads that serve.
//
// RunAsBackgroundThread lowers the calling thread's priority, in one of two
// classes:
// - kIdle (SCHED_IDLE): the kernel runs it only when a CPU would otherwise
//   be idle. A waking serving thread preempts it at once, and it never
//   competes with them, only for what they leave; under CPUs that stay
//   saturated it gets almost nothing (measured: with every core busy the
//   journal fell 5.5-9 s behind in a 1 s replay), so its work must be
//   best-effort and droppable: KV events (an overflow resynchronizes).
// - kLow (nice 10, SCHED_OTHER): a small fair share (about a tenth of a
//   nice-0 thread's) even when every core is busy, so it keeps up with work
//   that must not fall behind for good: the host-tier journal, whose
//   recorder otherwise stops once its queue overruns and every later host
//   copy is lost at a crash (measured under the same load: 14-57 ms behind;
//   nice 19: 0.4-1.2 s).
// Falls back to nice 19 where SCHED_IDLE is refused (a seccomp or container
// policy); logs a warning naming `who` when nothing can be set. There is no
// way back for an unprivileged thread.
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

enum class BackgroundClass { kIdle, kLow };

void RunAsBackgroundThread(const char* who,
                           BackgroundClass cls = BackgroundClass::kIdle);

// One background thread (RunAsBackgroundThread) that runs what it is handed
// and lets the caller wait for it. The work handed over must not take locks
// that serving threads take.
//
// Thread-safe; one Run at a time.
class BackgroundWorker {
 public:
  explicit BackgroundWorker(const char* who,
                            BackgroundClass cls = BackgroundClass::kIdle);
  // Stops the thread (after the Run in progress, if any).
  ~BackgroundWorker() ABSL_LOCKS_EXCLUDED(mu_);
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  // Runs `work` on the background thread; returns once it has returned.
  void Run(absl::FunctionRef<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop(const char* who, BackgroundClass cls) ABSL_LOCKS_EXCLUDED(mu_);

  Mutex mu_;
  CondVar cv_;
  const absl::FunctionRef<void()>* work_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace hicache
