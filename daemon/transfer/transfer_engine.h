#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

// Receives completions. Called from transfer worker threads, once per
// (op, rank, step) of every submitted task, with OK or the copy's error.
// Implementations must be thread-safe and must not call back into the
// TransferEngine synchronously.
class TransferListener {
 public:
  virtual ~TransferListener() = default;
  virtual void OnStepDone(uint64_t op_id, TransferDirection direction,
                          Rank rank, uint32_t step, absl::Status status,
                          uint64_t bytes) = 0;
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
  // Blocks until every task submitted so far has completed.
  virtual void Drain() = 0;
  // Copies `task` on the calling thread and returns the bytes moved; no
  // listener call. For paths that must finish before they return (write-back
  // of an eviction victim). Same validation as Submit.
  virtual absl::StatusOr<uint64_t> CopyNow(const TransferTask& task) = 0;
};

// Builds a transfer engine that reports its completions to `listener`
// (which must outlive it). Decorators take one to build the engine they wrap
// with themselves as its listener.
using TransferEngineFactory =
    std::function<std::unique_ptr<TransferEngine>(TransferListener* listener)>;

}  // namespace hicache
