#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/engine/op_event.h"

namespace hicache {

// Routes engine events to the streams that wait for them. A stream claims
// an operation for its EventMailbox; from then on that operation's events go
// straight to the mailbox (no polling), including those queued before the
// claim. Events of unclaimed operations are kept per operation until claimed
// or forgotten. Operations nobody streams (write-through and write-back
// backups) must not grow it without bound: past kMaxOps kept operations, the
// oldest *finished* ones (whose terminal event -- committed, rolled back,
// load done -- is queued) are dropped. An operation still running is never
// dropped, so a stream that claims its op a moment after the engine started
// it gets every event, however many other operations came and went.
//
// Thread-safe. Lock order: EventHub::mu_ -> EventMailbox::mu_.
class EventHub final : public EngineListener {
 public:
  static constexpr size_t kMaxOps = 4096;

  // Routes `event` (EngineListener).
  void OnOpEvent(const OpEvent& event) override ABSL_LOCKS_EXCLUDED(mu_);

  // Sends `op`'s queued and future events to `box` until Forget(op).
  void Claim(uint64_t op, std::shared_ptr<EventMailbox> box)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The next queued event of an unclaimed `op`, waiting up to `timeout`;
  // nullopt on timeout. For tests and in-process users.
  std::optional<OpEvent> Next(uint64_t op, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the claim on `op` and everything still queued for it.
  void Forget(uint64_t op) ABSL_LOCKS_EXCLUDED(mu_);

  // Worker subscriptions. A subscriber of (rank, namespace) receives the
  // per-layer events of that rank (backup steps, loaded layers with their
  // fences) and the outcome of every operation tagged with that namespace,
  // in addition to whoever claimed the operation. Tag an operation before
  // claiming it: the events queued so far are replayed to the subscribers.
  // Untagged operations (write-through) reach no subscriber.
  void Tag(uint64_t op, const std::string& ns) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t Subscribe(Rank rank, std::string ns,
                     std::shared_ptr<EventMailbox> box)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unsubscribe(uint64_t subscription) ABSL_LOCKS_EXCLUDED(mu_);
  // Operations currently claimed by a mailbox (for tests and stats).
  size_t claimed() const ABSL_LOCKS_EXCLUDED(mu_);
  // Also hands every event to `observer` (operators' Watch). Set before use.
  void SetObserver(std::function<void(const OpEvent&)> observer) {
    observer_ = std::move(observer);
  }
  // CP group leader (docs/cp-groups.md, "Worker events and acks across the
  // link"): also hands `tap` every event this hub fans out to subscribers,
  // with its op's namespace -- once per event, as it is fanned out
  // (including Tag's replay of queued events), whether or not a local
  // subscriber matched. Runs with the hub's lock held: it must only enqueue
  // (never call back into the hub, never wait). Set before use.
  using SubscriberTap =
      std::function<void(const OpEvent& event, const std::string& ns)>;
  void SetSubscriberTap(SubscriberTap tap) { tap_ = std::move(tap); }

 private:
  struct Subscriber {
    Rank rank = 0;
    std::string ns;
    std::shared_ptr<EventMailbox> box;
  };

  void Push(OpEvent event) ABSL_LOCKS_EXCLUDED(mu_);
  void QueueLocked(OpEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers `event` (of an op tagged `ns`) to the matching subscribers;
  // appends the mailboxes that overflowed.
  void FanOutLocked(const OpEvent& event, const std::string& ns,
                    std::vector<std::shared_ptr<EventMailbox>>* overflowed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::function<void(const OpEvent&)> observer_;
  SubscriberTap tap_;
  mutable Mutex mu_;
  CondVar cv_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<EventMailbox>> claims_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::deque<OpEvent>> queues_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> tags_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Subscriber> subscribers_ ABSL_GUARDED_BY(mu_);
  uint64_t next_subscription_ ABSL_GUARDED_BY(mu_) = 1;
  // Unclaimed ops whose terminal event is queued, oldest first: the ones
  // that may be dropped.
  std::deque<uint64_t> finished_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
