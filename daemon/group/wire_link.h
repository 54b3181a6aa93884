#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/group/group_wire.h"

namespace hicache::group {

// WireLink: one side of a leader <-> follower link speaking group_wire
// frames over a comm::Communicator it owns.
//
// Contract:
//  * Send stamps each frame with the link's epoch and the next sequence
//    number (1, 2, ... in the order frames are queued) and queues it; it
//    never waits for the network. INVALID_ARGUMENT (nothing queued, no
//    sequence number used) for a frame over comm::kMaxFrameBytes;
//    FAILED_PRECONDITION once the link failed.
//  * Receiving: each frame is decoded and checked -- it must decode, carry
//    this link's epoch, and the sequence number after the previous frame's
//    (the first is 1) -- then handed to `on_frame` on the communicator's
//    thread, in order. A frame that fails a check, or that `on_frame`
//    refuses (returns non-OK), is a protocol error: it is logged at error
//    level with the peer and the cause, counted, and the link is aborted
//    with DATA_LOSS naming both; no later frame reaches `on_frame`.
//  * `on_failure` is called exactly once when the link fails (the
//    communicator's failure, including an abort for a protocol error), on
//    the communicator's thread or the thread that aborts it.
//  * The destructor destroys the communicator (joining its threads; if the
//    link is still up, on_failure runs with CANCELLED). It must not run on
//    the communicator's thread; what the handlers touch must outlive it.
//
// Thread-safe. Lock order: send_mu_ before the communicator's locks;
// recv_mu_ is never held while a handler runs.
class WireLink {
 public:
  // Returns OK to accept a frame, anything else to call it a protocol error.
  using FrameHandler = std::function<absl::Status(Frame frame)>;
  using FailureHandler = std::function<void(const absl::Status& cause)>;

  struct Stats {
    int64_t frames_sent = 0;
    int64_t bytes_sent = 0;
    int64_t frames_received = 0;
    int64_t bytes_received = 0;
    int64_t protocol_errors = 0;
  };

  WireLink(std::unique_ptr<comm::Communicator> comm, uint64_t epoch);
  ~WireLink();
  WireLink(const WireLink&) = delete;
  WireLink& operator=(const WireLink&) = delete;

  // Starts delivery (comm::Communicator::Start). FAILED_PRECONDITION if
  // started twice or if the link failed before.
  absl::Status Start(FrameHandler on_frame, FailureHandler on_failure);
  absl::Status Send(const FrameBody& body) ABSL_LOCKS_EXCLUDED(send_mu_);
  // Fails the link with `cause` (idempotent); no frame reaches on_frame
  // after it returns (one being handled may finish).
  void Abort(const absl::Status& cause);

  std::string peer() const { return comm_->peer(); }
  uint64_t epoch() const { return epoch_; }
  Stats stats() const ABSL_LOCKS_EXCLUDED(send_mu_, recv_mu_);

 private:
  void OnBytes(absl::string_view bytes) ABSL_LOCKS_EXCLUDED(recv_mu_);
  void ProtocolError(const absl::Status& why) ABSL_LOCKS_EXCLUDED(recv_mu_);

  const std::unique_ptr<comm::Communicator> comm_;
  const uint64_t epoch_;
  FrameHandler on_frame_;  // Set by Start, before delivery begins.

  mutable Mutex send_mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(send_mu_) = 1;
  int64_t frames_sent_ ABSL_GUARDED_BY(send_mu_) = 0;
  int64_t bytes_sent_ ABSL_GUARDED_BY(send_mu_) = 0;

  mutable Mutex recv_mu_;
  uint64_t last_seq_ ABSL_GUARDED_BY(recv_mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(recv_mu_) = false;
  int64_t frames_received_ ABSL_GUARDED_BY(recv_mu_) = 0;
  int64_t bytes_received_ ABSL_GUARDED_BY(recv_mu_) = 0;
  int64_t protocol_errors_ ABSL_GUARDED_BY(recv_mu_) = 0;
};

}  // namespace hicache::group
