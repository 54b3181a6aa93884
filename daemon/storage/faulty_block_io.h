#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/mutex.h"
#include "daemon/storage/block_io.h"

namespace hicache {

// The faults a storage device can show, injected under a BlockIo (as
// FaultyTransferEngine does for copies). Counts are per op, in submission
// order, starting at 0 for the first op of that kind; `every` = 0 disables
// a fault, `every` = n hits ops n-1, 2n-1, ... of that kind.
struct BlockIoFaults {
  int64_t fail_write_every = 0;  // The write returns EIO; nothing written.
  int64_t fail_read_every = 0;   // The read returns EIO.
  // The write reports success but only its first half reaches the file (a
  // torn write: power lost mid-page).
  int64_t tear_write_every = 0;
  // The read returns the bytes with one bit flipped (media corruption that
  // the device did not catch).
  int64_t flip_read_every = 0;
};

// Wraps a BlockIo and injects BlockIoFaults. Thread-safe.
class FaultyBlockIo final : public BlockIo {
 public:
  FaultyBlockIo(std::unique_ptr<BlockIo> inner, BlockIoFaults faults);

  void Submit(std::vector<BlockIoOp> ops, BlockIoDone done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override;

  struct Injected {
    int64_t failed_writes = 0;
    int64_t failed_reads = 0;
    int64_t torn_writes = 0;
    int64_t flipped_reads = 0;
  };
  Injected injected() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Fault { kNone, kFail, kTear, kFlip };

  std::unique_ptr<BlockIo> inner_;
  const BlockIoFaults faults_;
  mutable Mutex mu_;
  int64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  Injected injected_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache
