#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::service {

// Fans cache events out to every Watch stream. Each subscriber has a bounded
// queue; when a slow watcher falls more than kMaxQueued behind, its oldest
// events are dropped and counted. Thread-safe.
class WatchBroadcaster {
 public:
  static constexpr size_t kMaxQueued = 10000;

  class Subscription {
   public:
    // The next event, waiting up to `timeout`.
    std::optional<v1::CacheEvent> Next(absl::Duration timeout)
        ABSL_LOCKS_EXCLUDED(mu_);
    int64_t dropped() const ABSL_LOCKS_EXCLUDED(mu_);

   private:
    friend class WatchBroadcaster;
    mutable Mutex mu_;
    CondVar cv_;
    std::deque<v1::CacheEvent> queue_ ABSL_GUARDED_BY(mu_);
    int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  };

  std::shared_ptr<Subscription> Subscribe() ABSL_LOCKS_EXCLUDED(mu_);
  void Unsubscribe(const std::shared_ptr<Subscription>& subscription)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Publish(const v1::CacheEvent& event) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Mutex mu_;
  std::vector<std::shared_ptr<Subscription>> subscribers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::service
