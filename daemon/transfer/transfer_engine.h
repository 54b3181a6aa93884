#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/layout/cp_layout.h"

namespace hicache {

enum class TransferDirection { kDeviceToHost, kHostToDevice };

// The pages one rank copies for one operation: device_pages[i] (physical, on
// that rank) pairs with host_pages[i]. Empty lists are valid: a rank that owns
// none of the operation's pages still completes every step (a no-op ack), so
// every rank sees the same number of acks.
struct RankCopy {
  Rank rank = 0;
  std::vector<PhysicalPage> device_pages;
  std::vector<int64_t> host_pages;
  // A fence registered with RegisterFence for this rank, or 0: the copy
  // starts only after the fence's latest signal at submit time (a worker's
  // "layer written" event on its compute stream). Only backends with events
  // accept fences.
  uint64_t wait_fence = 0;
};

// One step of one operation for every listed rank. A step is one layer of
// the KV geometry: steps [0, L) copy layer s of every target family, steps
// [L, L + D) layer s - L of every draft family (KvGeometry::StepBlocks).
struct TransferTask {
  uint64_t op_id = 0;
  TransferDirection direction = TransferDirection::kDeviceToHost;
  uint32_t step = 0;
  std::vector<RankCopy> ranks;
};

// The completion of one (op, rank, step).
struct StepDone {
  uint64_t op_id = 0;
  TransferDirection direction = TransferDirection::kDeviceToHost;
  Rank rank = 0;
  uint32_t step = 0;
  absl::Status status;  // OK, or why the copy failed (its bytes are garbage).
  uint64_t bytes = 0;   // Bytes moved (0 on failure).
  // For a host-to-device step on a backend with events: an exported event
  // (IPC handle bytes) recorded after the step's bytes landed on the device;
  // a worker waits on it before reading the layer. Empty otherwise.
  std::string fence;
};

// The completion of `rank`'s copy of `task` that failed with `status` (no
// bytes moved).
inline StepDone FailedStep(const TransferTask& task, Rank rank,
                           absl::Status status) {
  return StepDone{.op_id = task.op_id,
                  .direction = task.direction,
                  .rank = rank,
                  .step = task.step,
                  .status = std::move(status),
                  .bytes = 0};
}

// Receives completions. Called from transfer threads, once per (op, rank,
// step) of every submitted task. Implementations must be thread-safe and must
// not call back into the TransferEngine synchronously.
class TransferListener {
 public:
  virtual ~TransferListener() = default;
  virtual void OnStepDone(StepDone done) = 0;
};

// Moves KV bytes between the device and host pools. Asynchronous: Submit
// returns at once; completions arrive through the listener. The CPU backend
// copies with worker threads; a CUDA backend uses copy streams and events.
class TransferEngine {
 public:
  virtual ~TransferEngine() = default;
  // INVALID_ARGUMENT for a rank without pools, mismatched list lengths, a
  // page outside its pool or a step outside the geometry; nothing is queued
  // then.
  virtual absl::Status Submit(TransferTask task) = 0;
  // Blocks until every task submitted so far has completed and its listener
  // call has returned.
  virtual void Drain() = 0;

  // Fences (backends with events only; the others answer
  // FAILED_PRECONDITION). Registers a worker's exported event for `rank`
  // (IPC handle bytes, sent once) and returns its id (> 0) for
  // RankCopy::wait_fence. INVALID_ARGUMENT for a rank without pools or a
  // malformed handle.
  virtual absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                                 const std::string& handle) = 0;
  // Forgets a fence (its worker went away). NOT_FOUND for an unknown id.
  virtual absl::Status ReleaseFence(uint64_t fence) = 0;
  // The rank a fence was registered for; NOT_FOUND for an unknown id.
  virtual absl::StatusOr<Rank> FenceRank(uint64_t fence) const = 0;
};

// Builds a transfer engine that reports its completions to `listener`
// (which must outlive it). Decorators take one to build the engine they wrap
// with themselves as its listener.
using TransferEngineFactory =
    std::function<std::unique_ptr<TransferEngine>(TransferListener* listener)>;

}  // namespace hicache
