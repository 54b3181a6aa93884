#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/op_event.h"
#include "daemon/group/group_wire.h"

namespace hicache::group {

struct EventForwarderOptions {
  // Events queued for one member before it is failed (its link is too slow
  // or dead): the queue never grows past this.
  size_t max_queued_events = 65536;
  // Encoded bytes of one WorkerEvents frame's events (well under
  // comm::kMaxFrameBytes).
  size_t max_batch_bytes = size_t{1} << 20;
};

// EventForwarder: the CP group leader's side of "worker events across the
// link" (docs/cp-groups.md, "Worker events and acks across the link").
// The leader's EventHub hands it, through its subscriber tap, every event it
// fans out to subscribers with the op's namespace (Publish); the forwarder
// sends them, batched in WorkerEvents frames, to the members attached to it,
// so that workers subscribed on a follower daemon get what workers
// subscribed on the leader get.
//
// Contract:
//  * Publish(event, ns) only enqueues (it runs under the hub's lock): a
//    per-rank event (backup step, loaded layer) goes to the one member that
//    holds its rank (none if the leader holds it), an op outcome (committed,
//    rolled back, load done) to every attached member. Events reach each
//    member in Publish order.
//  * A member whose queue holds max_queued_events when one more arrives is
//    failed loudly: its queue is dropped, nothing more is queued for it,
//    and its `on_fail` runs once (RESOURCE_EXHAUSTED naming it) on the
//    forwarder's thread, with no lock of the forwarder's held. Likewise when
//    its `send` fails (with that status).
//  * Attach(name, ranks, send, on_fail) returns the member's sink id;
//    Detach(id) removes it and returns once no call to its `send` or
//    `on_fail` is running (so what they capture may go away after it). Do
//    not call Detach from inside `send` or `on_fail`.
//  * One sender thread calls every `send`, without the forwarder's lock;
//    `send` must not block on the network (WireLink::Send queues).
//  * Stop() (idempotent; the destructor calls it) joins the thread; later
//    Publish calls are dropped, Attach is FAILED_PRECONDITION.
//
// Thread-safe. Lock order: the hub's lock (Publish) before mu_; no lock of
// the forwarder's is held while `send` or `on_fail` runs.
class EventForwarder {
 public:
  using SendFn = std::function<absl::Status(const FrameBody& body)>;
  using FailFn = std::function<void(const absl::Status& cause)>;

  struct Stats {
    int64_t events_published = 0;
    int64_t events_sent = 0;
    int64_t frames_sent = 0;
    int64_t members_failed = 0;
  };
  // One attached member's share (sink_stats): events queued for it, sent to
  // it (in frames_sent frames), waiting now, and whether it was failed.
  struct SinkStats {
    int64_t events_queued = 0;
    int64_t events_sent = 0;
    int64_t frames_sent = 0;
    int64_t events_waiting = 0;
    bool failed = false;
  };

  explicit EventForwarder(EventForwarderOptions options = {});
  ~EventForwarder();
  EventForwarder(const EventForwarder&) = delete;
  EventForwarder& operator=(const EventForwarder&) = delete;

  // For EventHub::SetSubscriberTap.
  void Publish(const OpEvent& event, const std::string& ns)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<uint64_t> Attach(std::string name, std::vector<Rank> ranks,
                                  SendFn send, FailFn on_fail)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Detach(uint64_t sink) ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The counters of sink `sink`; nullopt once it was detached (or never
  // attached). A snapshot: cheap, takes mu_ only.
  std::optional<SinkStats> sink_stats(uint64_t sink) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The wire record of an event.
  static WorkerEventRecord ToRecord(const OpEvent& event,
                                    const std::string& ns);

 private:
  struct Sink {
    std::string name;
    std::vector<Rank> ranks;
    SendFn send;
    FailFn on_fail;
    std::deque<WorkerEventRecord> queue;
    bool failed = false;
    absl::Status failure;     // Set when failed and on_fail not yet run.
    bool fail_pending = false;
    int64_t events_queued = 0;
    int64_t events_sent = 0;
    int64_t frames_sent = 0;
  };

  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const EventForwarderOptions options_;
  mutable Mutex mu_;
  CondVar wake_;  // Events queued, a failure pending, or stopping.
  CondVar idle_;  // The sender finished a round.
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, Sink> sinks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sink_ ABSL_GUARDED_BY(mu_) = 1;
  // The sink whose send or on_fail runs now (0: none).
  uint64_t busy_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Last.
};

}  // namespace hicache::group
