#include "daemon/storage/uring_block_io.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

// user_data of the no-op that wakes the reaper to stop.
constexpr uint64_t kStopTag = ~uint64_t{0};

}  // namespace

absl::StatusOr<std::unique_ptr<UringBlockIo>> UringBlockIo::Create(
    int fd, int queue_depth) {
  if (queue_depth < 1 || queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "io_uring queue depth ", queue_depth, " is outside [1, 4096]"));
  }
  std::unique_ptr<UringBlockIo> io(new UringBlockIo(fd, queue_depth));
  // The completion queue is twice the submission queue by default, so
  // in_flight_ <= queue_depth_ never overflows it.
  const int rc =
      io_uring_queue_init(static_cast<unsigned>(queue_depth), &io->ring_, 0);
  if (rc < 0) {
    return absl::UnavailableError(
        absl::StrCat("io_uring_queue_init: ", std::strerror(-rc)));
  }
  io->reaper_ = std::thread([p = io.get()] { p->Reap(); });
  return io;
}

UringBlockIo::UringBlockIo(int fd, int queue_depth)
    : fd_(fd), queue_depth_(queue_depth) {
  MutexLock lock(&mu_);
  slots_.resize(queue_depth_);
  for (size_t i = 0; i < slots_.size(); ++i) free_slots_.push_back(i);
}

UringBlockIo::~UringBlockIo() {
  {
    MutexLock lock(&mu_);
    while (in_flight_ > 0) room_.Wait(&mu_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kStopTag);
    io_uring_submit(&ring_);
  }
  reaper_.join();
  io_uring_queue_exit(&ring_);
}

std::string UringBlockIo::Describe() const {
  return absl::StrCat("io_uring (queue depth ", queue_depth_, ")");
}

void UringBlockIo::Submit(std::vector<BlockIoOp> ops, BlockIoDone done) {
  std::shared_ptr<BlockIoBatch> batch =
      BlockIoBatch::Start(std::move(ops), std::move(done));
  if (batch == nullptr) return;
  MutexLock lock(&mu_);
  for (size_t i = 0; i < batch->ops.size(); ++i) {
    while (free_slots_.empty()) {
      io_uring_submit(&ring_);  // What is queued must run to make room.
      room_.Wait(&mu_);
    }
    const size_t slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = Pending{batch, i};
    const BlockIoOp& op = batch->ops[i];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // The submission queue is full: flush it.
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    if (op.kind == BlockIoOp::Kind::kRead) {
      io_uring_prep_read(sqe, fd_, op.buffer, static_cast<unsigned>(op.length),
                         static_cast<uint64_t>(op.offset));
    } else {
      io_uring_prep_write(sqe, fd_, op.buffer, static_cast<unsigned>(op.length),
                          static_cast<uint64_t>(op.offset));
    }
    io_uring_sqe_set_data64(sqe, slot);
    ++in_flight_;
  }
  io_uring_submit(&ring_);
}

void UringBlockIo::Reap() {
  while (true) {
    io_uring_cqe* cqe = nullptr;
    // Only this thread consumes completions, without mu_.
    const int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc < 0) continue;  // -EINTR; nothing else with a valid ring.
    const uint64_t tag = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (tag == kStopTag) return;
    std::shared_ptr<BlockIoBatch> finished;
    {
      MutexLock lock(&mu_);
      Pending pending = std::move(slots_[tag]);
      slots_[tag] = Pending{};
      free_slots_.push_back(tag);
      --in_flight_;
      room_.SignalAll();
      const BlockIoOp& op = pending.batch->ops[pending.index];
      absl::Status& result = pending.batch->results[pending.index];
      if (res < 0) {
        result = absl::UnavailableError(
            absl::StrCat(op.kind == BlockIoOp::Kind::kRead ? "read" : "write",
                         " at ", op.offset, ": ", std::strerror(-res)));
      } else if (static_cast<size_t>(res) != op.length) {
        result = absl::DataLossError(absl::StrCat("short transfer at ",
                                                  op.offset, ": ", res, " of ",
                                                  op.length, " bytes"));
      }
      if (--pending.batch->remaining == 0) finished = std::move(pending.batch);
    }
    if (finished) std::move(finished->done)(std::move(finished->results));
  }
}

}  // namespace hicache
