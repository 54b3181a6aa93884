#include "daemon/storage/faulty_block_io.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {
namespace {

bool Hits(int64_t every, int64_t n) {
  return every > 0 && (n + 1) % every == 0;
}

}  // namespace

FaultyBlockIo::FaultyBlockIo(std::unique_ptr<BlockIo> inner,
                             BlockIoFaults faults)
    : inner_(std::move(inner)), faults_(faults) {}

std::string FaultyBlockIo::Describe() const {
  return absl::StrCat(inner_->Describe(), " with injected faults");
}

FaultyBlockIo::Injected FaultyBlockIo::injected() const {
  MutexLock lock(&mu_);
  return injected_;
}

void FaultyBlockIo::Submit(std::vector<BlockIoOp> ops, BlockIoDone done) {
  std::vector<Fault> fault(ops.size(), Fault::kNone);
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind == BlockIoOp::Kind::kWrite) {
        const int64_t n = writes_++;
        if (Hits(faults_.fail_write_every, n)) {
          fault[i] = Fault::kFail;
          ++injected_.failed_writes;
        } else if (Hits(faults_.tear_write_every, n)) {
          fault[i] = Fault::kTear;
          ++injected_.torn_writes;
        }
      } else {
        const int64_t n = reads_++;
        if (Hits(faults_.fail_read_every, n)) {
          fault[i] = Fault::kFail;
          ++injected_.failed_reads;
        } else if (Hits(faults_.flip_read_every, n)) {
          fault[i] = Fault::kFlip;
          ++injected_.flipped_reads;
        }
      }
    }
  }
  // Failed ops never reach the device; torn writes reach it half-length.
  std::vector<BlockIoOp> passed;
  std::vector<size_t> where;  // passed[j] is ops[where[j]].
  for (size_t i = 0; i < ops.size(); ++i) {
    if (fault[i] == Fault::kFail) continue;
    BlockIoOp op = ops[i];
    if (fault[i] == Fault::kTear) {
      op.length = op.length / 2 / kBlockIoAlignment * kBlockIoAlignment;
      if (op.length == 0) continue;  // Nothing of it landed.
    }
    passed.push_back(op);
    where.push_back(i);
  }
  inner_->Submit(
      std::move(passed),
      [ops = std::move(ops), fault = std::move(fault), where = std::move(where),
       done = std::move(done)](std::vector<absl::Status> inner) mutable {
        std::vector<absl::Status> results(ops.size());
        for (size_t i = 0; i < ops.size(); ++i) {
          if (fault[i] == Fault::kFail) {
            results[i] = absl::UnavailableError(
                absl::StrCat("injected I/O error at ", ops[i].offset));
          }
        }
        for (size_t j = 0; j < where.size(); ++j) {
          results[where[j]] = std::move(inner[j]);
        }
        for (size_t i = 0; i < ops.size(); ++i) {
          if (fault[i] == Fault::kFlip && results[i].ok() &&
              ops[i].length > 0) {
            auto* bytes = static_cast<uint8_t*>(ops[i].buffer);
            bytes[ops[i].length / 3] ^= 0x10;
          }
        }
        std::move(done)(std::move(results));
      });
}

}  // namespace hicache
