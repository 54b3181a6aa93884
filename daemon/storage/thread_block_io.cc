#include "daemon/storage/thread_block_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {

ThreadBlockIo::ThreadBlockIo(int fd, int threads) : fd_(fd), threads_(threads) {
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Loop(); });
}

ThreadBlockIo::~ThreadBlockIo() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

std::string ThreadBlockIo::Describe() const {
  return absl::StrCat("threads (", threads_, ")");
}

void ThreadBlockIo::Submit(std::vector<BlockIoOp> ops, BlockIoDone done) {
  std::shared_ptr<BlockIoBatch> batch =
      BlockIoBatch::Start(std::move(ops), std::move(done));
  if (batch == nullptr) return;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < batch->ops.size(); ++i) queue_.push_back({batch, i});
  cv_.SignalAll();
}

absl::Status ThreadBlockIo::Run(const BlockIoOp& op) const {
  size_t moved = 0;
  auto* bytes = static_cast<char*>(op.buffer);
  while (moved < op.length) {
    const off_t at = static_cast<off_t>(op.offset + moved);
    const ssize_t n = op.kind == BlockIoOp::Kind::kRead
                          ? ::pread(fd_, bytes + moved, op.length - moved, at)
                          : ::pwrite(fd_, bytes + moved, op.length - moved, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat(op.kind == BlockIoOp::Kind::kRead ? "pread" : "pwrite",
                       " at ", op.offset, ": ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("short transfer at ", op.offset,
                                              ": ", moved, " of ", op.length,
                                              " bytes"));
    }
    moved += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void ThreadBlockIo::Loop() {
  while (true) {
    Work work;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) cv_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopping, and nothing left to run.
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status = Run(work.batch->ops[work.index]);
    bool last = false;
    {
      MutexLock lock(&mu_);
      work.batch->results[work.index] = std::move(status);
      last = --work.batch->remaining == 0;
    }
    if (last) std::move(work.batch->done)(std::move(work.batch->results));
  }
}

}  // namespace hicache
