#pragma once

// One link between two daemons of a CP group (docs/cp-groups.md): the leader
// and one follower. Only metadata travels over it (copy lists, completions,
// events, acknowledgements, heartbeats); KV bytes never cross daemons.
//
// Contract, for every implementation (Gloo over TCP, NCCL, the in-process
// loopback of tests):
//  * Frames are opaque byte strings of at most kMaxFrameBytes, delivered
//    whole, exactly once and in the order they were sent, or not at all.
//  * Send() never waits for the network: it queues the frame and returns.
//  * Start() begins delivery: `receiver` is called for each frame, in order,
//    on one thread the communicator owns (never concurrently with itself and
//    never from inside Send() or Abort()).
//  * The link fails at most once: the peer closed or died, nothing arrived
//    within the implementation's receive timeout (the group's heartbeats keep
//    a live link busy), a transport error, or Abort(). `on_failure` is then
//    called exactly once, with the cause, on the communicator's thread or
//    Abort()'s caller; no frame is delivered after it and every later Send()
//    returns FAILED_PRECONDITION naming the cause.
//  * No exception ever leaves an implementation (Gloo throws; it is caught
//    and turned into a status).
//  * The destructor aborts the link (if not failed yet, on_failure is called
//    with CANCELLED) and joins the communicator's threads; it must not run on
//    the communicator's own thread (i.e. from inside a callback).
//
// Thread-safe.

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hicache::comm {

inline constexpr size_t kMaxFrameBytes = size_t{16} << 20;

class Communicator {
 public:
  using Receiver = std::function<void(absl::string_view frame)>;
  using FailureHandler = std::function<void(const absl::Status& cause)>;

  virtual ~Communicator() = default;

  // Starts delivering frames. FAILED_PRECONDITION if called twice or after
  // the link failed (on_failure is not called then).
  virtual absl::Status Start(Receiver receiver, FailureHandler on_failure) = 0;

  // Queues `frame` for the peer. INVALID_ARGUMENT (nothing queued) for a
  // frame over kMaxFrameBytes; FAILED_PRECONDITION once the link failed.
  // Frames sent before Start() are queued, not lost.
  virtual absl::Status Send(std::string frame) = 0;

  // Fails the link with `cause` (if it has not failed yet) and unblocks its
  // threads. Idempotent.
  virtual void Abort(const absl::Status& cause) = 0;

  // The peer, for logs and status ("follower 1 at 10.0.0.2:7070").
  virtual std::string peer() const = 0;
};

}  // namespace hicache::comm
