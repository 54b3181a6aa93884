#include "daemon/engine/event_mailbox.h"

#include <utility>

#include "absl/time/clock.h"

namespace hicache {

EventMailbox::EventMailbox(size_t max_backlog,
                           std::function<void()> on_overflow)
    : max_backlog_(max_backlog), on_overflow_(std::move(on_overflow)) {}

std::optional<OpEvent> EventMailbox::Wait(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (events_.empty() && !closed_ && !overflowed_) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    cv_.WaitWithTimeout(&mu_, left);
  }
  if (events_.empty()) return std::nullopt;
  OpEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

void EventMailbox::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  cv_.SignalAll();
}

void EventMailbox::RunOverflow() {
  MutexLock lock(&mu_);
  if (!disarmed_ && on_overflow_) on_overflow_();
}

void EventMailbox::Disarm() {
  MutexLock lock(&mu_);
  disarmed_ = true;
}

bool EventMailbox::overflowed() const {
  MutexLock lock(&mu_);
  return overflowed_;
}

bool EventMailbox::Deliver(OpEvent event) {
  MutexLock lock(&mu_);
  if (overflowed_) return false;
  if (events_.size() >= max_backlog_) {
    overflowed_ = true;
    events_.clear();
    cv_.SignalAll();
    return true;
  }
  events_.push_back(std::move(event));
  cv_.Signal();
  return false;
}

}  // namespace hicache
