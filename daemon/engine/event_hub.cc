#include "daemon/engine/event_hub.h"

#include <utility>

#include "absl/time/clock.h"

namespace hicache {

void EventHub::Push(OpEvent event) {
  if (observer_) observer_(event);
  std::vector<std::shared_ptr<EventMailbox>> overflowed;
  {
    MutexLock lock(&mu_);
    if (auto tag = tags_.find(event.op); tag != tags_.end()) {
      FanOutLocked(event, tag->second, &overflowed);
      if (event.terminal()) tags_.erase(tag);
    }
    auto claim = claims_.find(event.op);
    if (claim != claims_.end()) {
      if (claim->second->Deliver(event)) overflowed.push_back(claim->second);
    } else {
      QueueLocked(std::move(event));
    }
  }
  for (const auto& box : overflowed) box->RunOverflow();
}

void EventHub::FanOutLocked(
    const OpEvent& event, const std::string& ns,
    std::vector<std::shared_ptr<EventMailbox>>* overflowed) {
  if (tap_) tap_(event, ns);
  const bool per_rank = event.type == OpEvent::Type::kBackupStep ||
                        event.type == OpEvent::Type::kLoadStep;
  for (const auto& [id, subscriber] : subscribers_) {
    if (subscriber.ns != ns) continue;
    if (per_rank && subscriber.rank != event.rank) continue;
    if (subscriber.box->Deliver(event)) overflowed->push_back(subscriber.box);
  }
}

void EventHub::Tag(uint64_t op, const std::string& ns) {
  std::vector<std::shared_ptr<EventMailbox>> overflowed;
  {
    MutexLock lock(&mu_);
    bool ended = false;
    if (auto queued = queues_.find(op); queued != queues_.end()) {
      for (const OpEvent& event : queued->second) {
        FanOutLocked(event, ns, &overflowed);
        ended |= event.terminal();
      }
    }
    if (!ended) tags_[op] = ns;
  }
  for (const auto& box : overflowed) box->RunOverflow();
}

uint64_t EventHub::Subscribe(Rank rank, std::string ns,
                             std::shared_ptr<EventMailbox> box) {
  MutexLock lock(&mu_);
  const uint64_t id = next_subscription_++;
  subscribers_[id] = Subscriber{rank, std::move(ns), std::move(box)};
  return id;
}

void EventHub::Unsubscribe(uint64_t subscription) {
  MutexLock lock(&mu_);
  subscribers_.erase(subscription);
}

void EventHub::QueueLocked(OpEvent event) {
  const uint64_t op = event.op;
  const bool terminal = event.terminal();
  queues_[op].push_back(std::move(event));
  if (terminal) finished_.push_back(op);
  // Drop the oldest finished queues (entries of ops since claimed or
  // forgotten are skipped).
  while (queues_.size() > kMaxOps && !finished_.empty()) {
    queues_.erase(finished_.front());
    finished_.pop_front();
  }
  // Entries of ops since claimed or forgotten must not accumulate either:
  // compact now and then (amortised O(1) per event).
  if (finished_.size() > 2 * kMaxOps) {
    std::deque<uint64_t> live;
    for (uint64_t id : finished_) {
      if (queues_.contains(id)) live.push_back(id);
    }
    finished_.swap(live);
  }
  cv_.SignalAll();
}

void EventHub::OnOpEvent(const OpEvent& event) { Push(event); }

std::optional<OpEvent> EventHub::Next(uint64_t op, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  MutexLock lock(&mu_);
  while (true) {
    auto it = queues_.find(op);
    if (it != queues_.end() && !it->second.empty()) {
      OpEvent event = std::move(it->second.front());
      it->second.pop_front();
      return event;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return std::nullopt;
    cv_.WaitWithTimeout(&mu_, left);
  }
}

void EventHub::Claim(uint64_t op, std::shared_ptr<EventMailbox> box) {
  bool overflow = false;
  {
    MutexLock lock(&mu_);
    auto queued = queues_.find(op);
    if (queued != queues_.end()) {
      for (OpEvent& event : queued->second) {
        overflow = box->Deliver(std::move(event)) || overflow;
      }
      queues_.erase(queued);
    }
    claims_[op] = box;
  }
  if (overflow) box->RunOverflow();
}

void EventHub::Forget(uint64_t op) {
  MutexLock lock(&mu_);
  queues_.erase(op);
  claims_.erase(op);
  tags_.erase(op);
}

size_t EventHub::claimed() const {
  MutexLock lock(&mu_);
  return claims_.size();
}

}  // namespace hicache
