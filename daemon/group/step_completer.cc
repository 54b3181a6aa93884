#include "daemon/group/step_completer.h"

#include <utility>

namespace hicache::group {

StepCompleter::StepCompleter(Deliver deliver)
    : deliver_(std::move(deliver)), thread_([this] { Loop(); }) {}

StepCompleter::~StepCompleter() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    work_cv_.SignalAll();
  }
  thread_.join();
}

void StepCompleter::Complete(std::vector<StepDone> dones) {
  if (dones.empty()) return;
  MutexLock lock(&mu_);
  for (StepDone& done : dones) queue_.push_back(std::move(done));
  work_cv_.SignalAll();
}

void StepCompleter::Drain() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || delivering_) idle_cv_.Wait(&mu_);
}

int64_t StepCompleter::delivered() const {
  MutexLock lock(&mu_);
  return delivered_;
}

void StepCompleter::Loop() {
  while (true) {
    StepDone done;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stopping_) work_cv_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping, and everything delivered.
      done = std::move(queue_.front());
      queue_.pop_front();
      delivering_ = true;
    }
    deliver_(std::move(done));
    MutexLock lock(&mu_);
    delivering_ = false;
    ++delivered_;
    if (queue_.empty()) idle_cv_.SignalAll();
  }
}

}  // namespace hicache::group
