#include "daemon/core/background_thread.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "spdlog/spdlog.h"

namespace hicache {

void RunAsBackgroundThread(const char* who, BackgroundClass cls) {
  if (cls == BackgroundClass::kLow) {
    // Ten below the thread's priority now (the daemon's), in the normal
    // class even if the thread inherited another.
    sched_param normal{};
    (void)sched_setscheduler(0, SCHED_OTHER, &normal);
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
    const int lowered = std::min(19, (errno == 0 ? now : 0) + 10);
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), lowered) ==
        0) {
      return;
    }
    spdlog::warn("{}: could not lower the thread's priority; it runs at the "
                 "daemon's",
                 who);
    return;
  }
  sched_param param{};
  if (sched_setscheduler(0, SCHED_IDLE, &param) == 0) return;
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19) == 0) return;
  spdlog::warn("{}: could not lower the thread's priority; it runs at the "
               "daemon's",
               who);
}

BackgroundWorker::BackgroundWorker(const char* who, BackgroundClass cls)
    : thread_([this, who, cls] { Loop(who, cls); }) {}

BackgroundWorker::~BackgroundWorker() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();
}

void BackgroundWorker::Run(absl::FunctionRef<void()> work) {
  MutexLock lock(&mu_);
  work_ = &work;
  done_ = false;
  cv_.SignalAll();
  while (!done_) cv_.Wait(&mu_);
  work_ = nullptr;
}

void BackgroundWorker::Loop(const char* who, BackgroundClass cls) {
  RunAsBackgroundThread(who, cls);
  // Explicit Lock/Unlock: the lock is released around the work.
  mu_.Lock();
  while (true) {
    while (!stop_ && (work_ == nullptr || done_)) cv_.Wait(&mu_);
    if (work_ == nullptr || done_) break;  // Stopping, and nothing to run.
    const absl::FunctionRef<void()>* work = work_;
    mu_.Unlock();
    (*work)();
    mu_.Lock();
    done_ = true;
    cv_.SignalAll();
  }
  mu_.Unlock();
}

}  // namespace hicache
