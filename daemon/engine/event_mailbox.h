#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/op_event.h"

namespace hicache {

// The events one stream receives: those of the operations it claimed in an
// EventHub, in arrival order. A stream's writer blocks in Wait() (no polling)
// until an event arrives or the stream's reader calls Close().
//
// Backlog: a stream whose client reads too slowly is cut off. When more than
// `max_backlog` events wait, the mailbox is marked overflowed, later events
// are dropped, waiters wake, and `on_overflow` runs once (outside every lock;
// it typically cancels the RPC so that the stream can roll back and end).
//
// Thread-safe. Lock order: EventHub::mu_ -> EventMailbox::mu_.
class EventMailbox {
 public:
  EventMailbox(size_t max_backlog, std::function<void()> on_overflow);

  // The next event, waiting until `deadline`; nullopt on timeout, or once
  // the mailbox is closed or overflowed and no event is left to take.
  std::optional<OpEvent> Wait(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes every waiter; Wait() returns what is queued, then nullopt.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);
  bool overflowed() const ABSL_LOCKS_EXCLUDED(mu_);

  // For EventHub: queues one event. Returns true if this call overflowed the
  // mailbox (the caller then runs RunOverflow() without locks held).
  bool Deliver(OpEvent event) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `on_overflow` (under the mailbox's lock, so that it never runs
  // after Disarm() returned).
  void RunOverflow() ABSL_LOCKS_EXCLUDED(mu_);
  // From now on `on_overflow` never runs: call before whatever it touches
  // goes away (the stream's ServerContext).
  void Disarm() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t max_backlog_;
  const std::function<void()> on_overflow_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<OpEvent> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool overflowed_ ABSL_GUARDED_BY(mu_) = false;
  bool disarmed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace hicache
