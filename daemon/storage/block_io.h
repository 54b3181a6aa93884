#pragma once

// BlockIo: asynchronous positioned reads and writes on one open file, the
// I/O engine under FilePageStore. Two implementations: io_uring
// (UringBlockIo, liburing) and a thread pool of pread/pwrite
// (ThreadBlockIo) where io_uring is unavailable; FaultyBlockIo wraps either
// to inject errors, torn writes and flipped bits.
//
// With O_DIRECT files every buffer, offset and length must be aligned to
// kBlockIoAlignment; the callers here always align them.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"

namespace hicache {

inline constexpr size_t kBlockIoAlignment = 4096;

struct BlockIoOp {
  enum class Kind { kRead, kWrite };
  Kind kind = Kind::kRead;
  int64_t offset = 0;
  void* buffer = nullptr;  // kWrite: read from; kRead: written to.
  size_t length = 0;
};

using BlockIoDone = absl::AnyInvocable<void(std::vector<absl::Status>) &&>;

// One Submit's ops and what their completions gather, for the
// implementations: each finished op sets its result and decrements
// `remaining` (under the implementation's lock); the last one hands the
// results to `done`.
struct BlockIoBatch {
  // The batch of `ops`, or nullptr after calling `done` with no results
  // when there are none.
  static std::shared_ptr<BlockIoBatch> Start(std::vector<BlockIoOp> ops,
                                             BlockIoDone done) {
    if (ops.empty()) {
      std::move(done)({});
      return nullptr;
    }
    auto batch = std::make_shared<BlockIoBatch>();
    batch->results.resize(ops.size());
    batch->remaining = ops.size();
    batch->ops = std::move(ops);
    batch->done = std::move(done);
    return batch;
  }

  std::vector<BlockIoOp> ops;
  std::vector<absl::Status> results;
  BlockIoDone done;
  size_t remaining = 0;
};

class BlockIo {
 public:
  // Waits for every submitted batch's `done` to have run.
  virtual ~BlockIo() = default;

  // Runs every op (in any order, concurrently) and then calls `done` once,
  // on an I/O thread, with one status per op: OK when all `length` bytes
  // moved; UNAVAILABLE for an I/O error (errno in the message); DATA_LOSS
  // for a short transfer. The buffers must stay valid until then. May block
  // while too many ops are in flight (a bounded queue), never for I/O.
  virtual void Submit(std::vector<BlockIoOp> ops, BlockIoDone done) = 0;

  // "io_uring (queue depth 64)", "threads (4)", ...
  virtual std::string Describe() const = 0;
};

}  // namespace hicache
