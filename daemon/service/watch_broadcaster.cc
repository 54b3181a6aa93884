#include "daemon/service/watch_broadcaster.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace hicache::service {

std::optional<v1::CacheEvent> WatchBroadcaster::Subscription::Next(
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (queue_.empty()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    cv_.WaitWithTimeout(&mu_, left);
  }
  v1::CacheEvent event = std::move(queue_.front());
  queue_.pop_front();
  return event;
}

int64_t WatchBroadcaster::Subscription::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

std::shared_ptr<WatchBroadcaster::Subscription> WatchBroadcaster::Subscribe() {
  auto subscription = std::make_shared<Subscription>();
  MutexLock lock(&mu_);
  subscribers_.push_back(subscription);
  return subscription;
}

void WatchBroadcaster::Unsubscribe(
    const std::shared_ptr<Subscription>& subscription) {
  MutexLock lock(&mu_);
  subscribers_.erase(
      std::remove(subscribers_.begin(), subscribers_.end(), subscription),
      subscribers_.end());
}

void WatchBroadcaster::Publish(const v1::CacheEvent& event) {
  MutexLock lock(&mu_);
  for (const auto& subscriber : subscribers_) {
    MutexLock queue_lock(&subscriber->mu_);
    if (subscriber->queue_.size() >= kMaxQueued) {
      subscriber->queue_.pop_front();
      ++subscriber->dropped_;
    }
    subscriber->queue_.push_back(event);
    subscriber->cv_.SignalAll();
  }
}

}  // namespace hicache::service
