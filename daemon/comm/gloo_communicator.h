#pragma once

// GlooCommunicator: a Communicator (communicator.h) over Gloo's TCP
// transport, one per link between exactly two daemons (docs/cp-groups.md,
// "Links").
//
// Each link is its own 2-rank Gloo context: Gloo poisons a whole context on
// any timeout or peer failure, so sharing one context between members would
// let one dead follower kill every link. The TCP device (one listening
// address, one event-loop thread) is shared by all links of a daemon.
//
// Connect() rendezvouses through a gloo::rendezvous::Store under a key prefix
// unique to this link instance (group/epoch/member): both ends call it at
// about the same time with ranks 0 (leader side) and 1 (follower side); it
// blocks until connected or `connect_timeout` (Gloo's accept phase may take
// up to 5x that) and never throws.
//
// Frames travel in messages of kMessageBytes (message_framing.h): a sender
// thread packs the queue (small frames share a message, large ones are
// fragmented) and sends one message at a time; a receiver thread keeps one
// receive of kMessageBytes posted (Gloo's event loop aborts the process if a
// message is longer than the posted receive, so both ends must use the same
// kMessageBytes), reassembles and delivers. The sender thread runs from
// Connect (frames sent before Start go out once the peer Starts); the
// receiver thread from Start. Call Start soon after Connect: a message the
// peer cannot hand over within `receive_timeout` fails its link.
//
// Failures (reported once through on_failure, on the receiver thread):
//  * the peer closed or died, or the connection broke: UNAVAILABLE naming
//    the peer;
//  * nothing arrived for `receive_timeout`, or a message was not taken by
//    the peer within it: DEADLINE_EXCEEDED (the group layer's heartbeats
//    keep a live link busy);
//  * a malformed message: DATA_LOSS; any other Gloo error: INTERNAL;
//  * Abort(cause): cause; the destructor: CANCELLED.
// On any failure the link's connection is closed (the peer then fails with
// UNAVAILABLE) and both threads are unblocked. Frames still queued or in
// flight are lost.
//
// Gloo TCP is neither encrypted nor authenticated: bind the device to a
// private group network. Thread-safe.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/message_framing.h"
#include "daemon/core/mutex.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/device.h"
#include "gloo/transport/unbound_buffer.h"

namespace hicache::comm {

struct GlooLinkOptions {
  // Rendezvous store (not owned; used only during Connect). A FileStore in
  // tests, the group's gRPC-backed store in the daemon.
  gloo::rendezvous::Store* store = nullptr;
  // Unique per link instance, e.g. "cp/<group>/<epoch>/<member>": keys of an
  // earlier instance under the same prefix would be read as this one's.
  std::string key_prefix;
  // This end's rank in the link: 0 on the leader side, 1 on the follower's.
  int rank = -1;
  // The daemon's TCP device (GlooCommunicator::CreateTcpDevice).
  std::shared_ptr<gloo::transport::Device> device;
  absl::Duration connect_timeout = absl::Seconds(30);
  // No message for this long, or a message the peer does not take within
  // it, fails the link with DEADLINE_EXCEEDED.
  absl::Duration receive_timeout = absl::Seconds(1);
  // For peer(); default "rank <r> of <key_prefix>".
  std::string peer_name;
};

class GlooCommunicator final : public Communicator {
 public:
  // Bytes of one message on the wire (header included): part of the wire
  // format, equal on both ends.
  static constexpr size_t kMessageBytes = size_t{256} << 10;

  // The Gloo slot carrying the messages sent by `sender_rank` (one slot per
  // direction). Part of the wire format.
  static constexpr uint64_t MessageSlot(int sender_rank) {
    return uint64_t{0x6869636163686500} + static_cast<uint64_t>(sender_rank);
  }

  // A TCP device listening on `bind`: a network interface name ("eth1") or
  // a host name / address ("10.0.0.2", "127.0.0.1"); ports are chosen by
  // the OS. INVALID_ARGUMENT for an empty bind, UNAVAILABLE if Gloo cannot
  // resolve it. Ignores SIGPIPE process-wide unless a handler is installed
  // (Gloo needs it: it writes to sockets a peer may have reset).
  static absl::StatusOr<std::shared_ptr<gloo::transport::Device>>
  CreateTcpDevice(const std::string& bind);

  // Connects this end of the link (see the file comment). INVALID_ARGUMENT
  // for bad options; DEADLINE_EXCEEDED / UNAVAILABLE / INTERNAL from Gloo.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      GlooLinkOptions options);

  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  absl::Status Start(Receiver receiver, FailureHandler on_failure) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Send(std::string frame) override ABSL_LOCKS_EXCLUDED(mu_);
  void Abort(const absl::Status& cause) override ABSL_LOCKS_EXCLUDED(mu_);
  std::string peer() const override { return peer_name_; }

 private:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context,
                   int rank, absl::Duration receive_timeout,
                   std::string peer_name);

  // Records the first failure, unblocks both threads and closes the
  // connection. Never calls back.
  void Fail(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  void SendLoop();
  void ReceiveLoop(Receiver receiver, FailureHandler on_failure);
  // Receives and delivers until the link fails.
  void ReceiveUntilFailure(const Receiver& receiver);

  const std::shared_ptr<gloo::rendezvous::Context> context_;
  const int peer_rank_;
  const uint64_t my_slot_;    // Gloo slot of the messages this end sends.
  const uint64_t peer_slot_;  // ... and of those it receives.
  const std::chrono::milliseconds timeout_;
  const std::string peer_name_;

  // Message memory and Gloo's views of it. Only the sender thread touches
  // send_memory_, only the receiver thread recv_memory_ (besides Gloo).
  std::vector<char> send_memory_;
  std::vector<char> recv_memory_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buffer_;
  std::unique_ptr<gloo::transport::UnboundBuffer> recv_buffer_;

  Mutex mu_;
  CondVar send_cv_;  // A frame was queued, or the link failed.
  std::vector<std::string> outbox_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> failure_ ABSL_GUARDED_BY(mu_);
  std::thread sender_ ABSL_GUARDED_BY(mu_);
  std::thread receiver_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::comm
