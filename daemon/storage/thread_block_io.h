#pragma once

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/storage/block_io.h"

namespace hicache {

// BlockIo on a pool of threads that each run one blocking pread/pwrite at a
// time (retrying EINTR and continuing short transfers). The portable
// fallback where io_uring is not available. Does not own `fd`.
class ThreadBlockIo final : public BlockIo {
 public:
  // REQUIRES threads >= 1.
  ThreadBlockIo(int fd, int threads);
  ~ThreadBlockIo() override ABSL_LOCKS_EXCLUDED(mu_);

  void Submit(std::vector<BlockIoOp> ops, BlockIoDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override;

 private:
  struct Work {
    std::shared_ptr<BlockIoBatch> batch;
    size_t index;
  };

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Run(const BlockIoOp& op) const;

  const int fd_;
  const int threads_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Work> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace hicache
