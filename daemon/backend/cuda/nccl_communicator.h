#pragma once

// NcclCommunicator: a Communicator (daemon/comm/communicator.h) over NCCL,
// for the links of a CP group whose daemons run on GPU nodes
// (docs/cp-groups.md, "Links"). One per link between exactly two daemons.
//
// The link (cuda_kernels/raw_nccl.h) is two 2-rank NCCL communicators, one
// per direction, each used by one thread only: a sender thread packs queued
// frames into fixed-size messages (daemon/comm/message_framing.h, the same
// framing as the Gloo link) and sends them one at a time; a receiver thread
// keeps one receive posted, reassembles and delivers. Messages are always
// exactly `message_bytes` (NCCL needs matching counts), staged through
// pinned host memory on the link's GPU.
//
// Bootstrap: one side makes two unique ids (NewUniqueIds) and the other gets
// them out of band (the group's join reply); both then call Connect at
// about the same time, side 0 on the leader, side 1 on the follower. Connect
// blocks until both joined.
//
// NCCL has no timeouts, so a watchdog thread enforces `receive_timeout`:
// nothing received for that long fails the link with DEADLINE_EXCEEDED and
// aborts both communicators, which unblocks the threads (the group's
// heartbeats keep a live link busy). Other failures: a transport error
// (UNAVAILABLE naming the peer), a malformed message (DATA_LOSS),
// Abort(cause), the destructor (CANCELLED); on_failure runs once, on the
// receiver thread. Without NCCL compiled in, or without a GPU, Connect and
// NewUniqueIds return UNAVAILABLE saying so.
//
// Thread-safe.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/message_framing.h"
#include "daemon/core/mutex.h"

namespace hicache {

class NcclCommunicator final : public comm::Communicator {
 public:
  using UniqueId = std::array<uint8_t, 128>;
  struct UniqueIds {
    UniqueId forward;   // Side 0 sends on it.
    UniqueId backward;  // Side 1 sends on it.
  };
  struct Options {
    UniqueIds ids;
    int side = 0;    // 0: the leader's end, 1: the follower's.
    int device = 0;  // The GPU the link's buffers and streams live on.
    size_t message_bytes = size_t{64} << 10;  // Same on both sides.
    absl::Duration receive_timeout = absl::Seconds(5);
    std::string peer_name;  // For logs and errors.
  };

  // Whether this build has NCCL (else every link is UNAVAILABLE).
  static bool Compiled();
  static absl::StatusOr<UniqueIds> NewUniqueIds();
  // INVALID_ARGUMENT for a side other than 0/1, message_bytes < 64 or a
  // non-positive timeout; UNAVAILABLE without NCCL or on an NCCL/CUDA error
  // (the message names it).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(
      const Options& options);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  absl::Status Start(Receiver receiver, FailureHandler on_failure) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Send(std::string frame) override ABSL_LOCKS_EXCLUDED(mu_);
  void Abort(const absl::Status& cause) override ABSL_LOCKS_EXCLUDED(mu_);
  std::string peer() const override { return options_.peer_name; }

 private:
  NcclCommunicator(const Options& options, void* link);
  void SendLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void ReceiveLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void WatchdogLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Records the first failure and aborts the link (unblocking both
  // threads); later calls do nothing.
  void Fail(const absl::Status& cause) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status FromRaw(int code, const char* what) const;

  const Options options_;
  void* const link_;  // raw_nccl link; closed by the destructor.

  mutable Mutex mu_;
  CondVar send_cv_;      // The sender: frames queued, or failed/stopping.
  CondVar watchdog_cv_;  // The watchdog: failed/stopping.
  comm::MessagePacker packer_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);  // OK while the link is up.
  absl::Time last_receive_ ABSL_GUARDED_BY(mu_);
  Receiver receiver_ ABSL_GUARDED_BY(mu_);
  FailureHandler on_failure_ ABSL_GUARDED_BY(mu_);

  std::thread sender_;
  std::thread receiver_thread_;
  std::thread watchdog_;
};

}  // namespace hicache
