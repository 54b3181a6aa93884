#pragma once

#include <liburing.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/core/mutex.h"
#include "daemon/storage/block_io.h"

namespace hicache {

// BlockIo on io_uring (liburing): Submit queues the ops on the ring and
// returns; one completion thread reaps them and runs each batch's `done`.
// At most `queue_depth` ops are in flight: Submit waits (on a condition, not
// a poll) for room beyond that. Does not own `fd`.
class UringBlockIo final : public BlockIo {
 public:
  // UNAVAILABLE when the kernel refuses io_uring (an old kernel, or a
  // seccomp policy: containers often forbid io_uring_setup). REQUIRES
  // queue_depth in [1, 4096].
  static absl::StatusOr<std::unique_ptr<UringBlockIo>> Create(int fd,
                                                              int queue_depth);
  ~UringBlockIo() override ABSL_LOCKS_EXCLUDED(mu_);

  void Submit(std::vector<BlockIoOp> ops, BlockIoDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override;

 private:
  struct Pending {
    std::shared_ptr<BlockIoBatch> batch;
    size_t index;
  };

  UringBlockIo(int fd, int queue_depth);
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);

  const int fd_;
  const int queue_depth_;
  Mutex mu_;
  CondVar room_;  // Signalled as ops complete.
  // The submission side is used under mu_, the completion side only by the
  // reaper thread: io_uring allows one of each concurrently.
  io_uring ring_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Slots for in-flight ops; a CQE's user_data is its slot index.
  std::vector<Pending> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<size_t> free_slots_ ABSL_GUARDED_BY(mu_);
  std::thread reaper_;
};

}  // namespace hicache
