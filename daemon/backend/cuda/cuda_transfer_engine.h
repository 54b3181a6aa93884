#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/core/mutex.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache {

struct CudaTransferEngineOptions {
  // CUDA device ordinal of each rank (indexed by rank); every rank with pools
  // needs one.
  std::vector<int> device_of_rank;
  // BatchedPageCopy::max_blocks of every launch (0: the kernel's default):
  // caps the SMs a copy occupies so that it does not starve compute.
  int32_t max_blocks_per_copy = 0;
  // Interprocess events per rank that stamp host-to-device steps
  // (StepDone::fence), reused round-robin. Reuse is safe: a worker waiting
  // on a recycled event waits for a later record, which is only later.
  int fence_ring_size = 64;
};

// The CUDA backend's transfer engine: batched gather/scatter launches on two
// streams per served rank (device-to-host and host-to-device), completions
// through events. Everything goes through cuda::CudaRuntime (real or
// simulated); no CUDA header is included.
//
// A "lane" is one (rank, direction) stream. Per submitted (task, rank):
//   1. a pooled event and a pinned staging buffer holding the launch's
//      descriptors (CopyRegion[regions], src pages, dst pages; see
//      BatchedPageCopy) are taken from the lane's free lists (grown on
//      demand, recycled once the launch completed: the kernel reads the
//      descriptors while it runs);
//   2. StreamWaitEvent on the RankCopy's fence, if any (ordered after the
//      fence's latest record at Submit time);
//   3. ONE LaunchPageCopy: one CopyRegion per (family, layer) block of the
//      step, all page pairs (none when the page lists are empty: the step is
//      then a no-op ack ordered on the stream);
//   4. RecordEvent (completion), and for host-to-device steps a record of
//      the lane's next interprocess fence event, whose IPC handle is the
//      StepDone::fence.
// Each lane has its own completion thread that blocks in SynchronizeEvent on
// its steps in submission order, then calls the listener. One thread per
// lane rather than one per engine: a blocking wait is per event, so a single
// thread would serialize the lanes (a long backup would hold up the
// completion of a latency-critical load on another stream), and polling
// several lanes with QueryEvent would be a polling loop.
//
// Failure model. A CUDA error in any call for a step (resource allocation,
// StreamWaitEvent, LaunchPageCopy, RecordEvent) or an asynchronous error
// reported by its event fails that step: OnStepDone carries the error and
// bytes 0, never OK for bytes that may be wrong. An asynchronous error is
// sticky for a CUDA stream (real CUDA: for the whole context), so it also
// marks the lane failed for the engine's lifetime: every later step of that
// lane, already enqueued or submitted later, fails with FAILED_PRECONDITION
// naming the first error, without touching the stream. Submit itself never
// reports it (Submit validates only, and stays cheap); StreamStatus() does.
// Synchronous refusals (a launch refused, a record refused) fail only their
// step: the stream is still sound. A lane whose stream could not be created
// is failed from the start (setup_status()).
//
// Threading: thread-safe. Locks (all leaves, never held together, never
// held while calling the listener): fence_mu_ (the fence table), each
// lane's mu (its queue, free lists and failure), idle_mu_ (the in-flight
// count). Runtime calls made under a lane's mu only enqueue or allocate;
// the blocking SynchronizeEvent/SynchronizeStream run without any lock.
class CudaTransferEngine final : public TransferEngine {
 public:
  // Builds streams, events and threads for every served rank of `pools`.
  // FAILED_PRECONDITION / the runtime's error when any lane could not be set
  // up (nothing is left behind then). `runtime`, `pools` and `listener` must
  // outlive the engine.
  static absl::StatusOr<std::unique_ptr<CudaTransferEngine>> Create(
      cuda::CudaRuntime* runtime, const RankPools* pools,
      TransferListener* listener, CudaTransferEngineOptions options);

  // As Create, but never fails: lanes that could not be set up fail every
  // step (see setup_status()).
  CudaTransferEngine(cuda::CudaRuntime* runtime, const RankPools* pools,
                     TransferListener* listener,
                     CudaTransferEngineOptions options);
  // Drains, stops the completion threads, then releases streams, events,
  // staging buffers and fences.
  ~CudaTransferEngine() override ABSL_LOCKS_EXCLUDED(fence_mu_, idle_mu_);
  CudaTransferEngine(const CudaTransferEngine&) = delete;
  CudaTransferEngine& operator=(const CudaTransferEngine&) = delete;

  // Validates like the CPU engine (rank with pools, list lengths, page
  // ranges, step in the geometry) and also that every wait_fence is
  // registered for that same rank; INVALID_ARGUMENT with nothing queued
  // otherwise. Then enqueues one launch per rank and returns.
  absl::Status Submit(TransferTask task) override
      ABSL_LOCKS_EXCLUDED(fence_mu_, idle_mu_);
  void Drain() override ABSL_LOCKS_EXCLUDED(idle_mu_);

  // Opens the worker's exported event on the rank's device.
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override
      ABSL_LOCKS_EXCLUDED(fence_mu_);
  // Forgets the id at once; the event itself is destroyed when no submitted
  // step still waits on it.
  absl::Status ReleaseFence(uint64_t fence) override
      ABSL_LOCKS_EXCLUDED(fence_mu_);
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override
      ABSL_LOCKS_EXCLUDED(fence_mu_);

  // OK, or the first setup error of any lane.
  const absl::Status& setup_status() const { return setup_status_; }
  // OK, or why the (rank, direction) stream is unusable; NOT_FOUND for a
  // rank that is not served.
  absl::Status StreamStatus(Rank rank, TransferDirection direction) const;

 private:
  struct Staging {
    void* data = nullptr;
    size_t capacity = 0;
  };
  struct IpcFenceEvent {
    cuda::Event event = nullptr;
    std::string handle;
  };
  // One submitted (task, rank) waiting for completion on its lane.
  struct Pending {
    std::shared_ptr<const TransferTask> task;
    size_t rank_index = 0;
    absl::Status status;         // Preset failure (nothing to wait for).
    cuda::Event done = nullptr;  // Recorded after the launch.
    bool launched = false;       // Work on the stream reads `staging`.
    Staging staging;             // Returned to the lane on completion.
    uint64_t wait_fence = 0;     // Fence reference dropped on completion.
    std::string fence;           // IPC handle for StepDone::fence.
    uint64_t bytes = 0;
  };
  struct Lane {
    // Fixed after construction.
    Rank rank = 0;
    TransferDirection direction = TransferDirection::kDeviceToHost;
    int device = -1;
    cuda::Stream stream = nullptr;
    void* device_base = nullptr;
    void* host_base = nullptr;
    std::vector<IpcFenceEvent> fence_ring;  // Host-to-device lanes only.
    std::thread completion;

    mutable Mutex mu;
    CondVar work_cv;
    std::deque<Pending> pending ABSL_GUARDED_BY(mu);
    std::vector<Staging> free_staging ABSL_GUARDED_BY(mu);
    std::vector<cuda::Event> free_events ABSL_GUARDED_BY(mu);
    size_t next_fence ABSL_GUARDED_BY(mu) = 0;
    absl::Status failed ABSL_GUARDED_BY(mu);  // Sticky lane failure.
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };
  struct Fence {
    Rank rank = 0;
    cuda::Event event = nullptr;
    int64_t refs = 0;       // Submitted steps still waiting on it.
    bool released = false;  // ReleaseFence called; destroy at refs == 0.
  };

  static absl::Status Annotate(const absl::Status& status,
                               absl::string_view context);
  static const char* DirectionName(TransferDirection direction);
  Lane* LaneOf(Rank rank, TransferDirection direction) const;
  absl::Status SetUpLane(Lane& lane);
  void ReleaseLane(Lane& lane);
  absl::Status Validate(const TransferTask& task) const;
  // Checks the task's fences and takes one reference per RankCopy that waits
  // on one; fills `events` (parallel to task.ranks, nullptr without fence).
  absl::Status AcquireFences(const TransferTask& task,
                             std::vector<cuda::Event>& events)
      ABSL_LOCKS_EXCLUDED(fence_mu_);
  void DropFenceRef(uint64_t fence) ABSL_LOCKS_EXCLUDED(fence_mu_);
  // Issues one (task, rank) on its lane and queues its completion.
  void Enqueue(Lane& lane, std::shared_ptr<const TransferTask> task,
               size_t rank_index, cuda::Event fence_event)
      ABSL_LOCKS_EXCLUDED(lane.mu);
  // Runtime calls for one step; fills `p` (status, done, launched, ...).
  void Issue(Lane& lane, Pending& p, cuda::Event fence_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  absl::StatusOr<Staging> AcquireStaging(Lane& lane, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  absl::StatusOr<cuda::Event> AcquireEvent(Lane& lane)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  void CompletionLoop(Lane& lane) ABSL_LOCKS_EXCLUDED(lane.mu, idle_mu_);

  cuda::CudaRuntime* const runtime_;
  const RankPools* const pools_;
  TransferListener* const listener_;
  const CudaTransferEngineOptions options_;
  // regions_[direction][step]: the step's CopyRegions (src/dst by direction)
  // and bytes_per_pair_[step] the bytes one page pair moves.
  std::vector<std::vector<cuda::CopyRegion>> regions_[2];
  std::vector<uint64_t> bytes_per_pair_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // [rank * 2 + direction].
  absl::Status setup_status_;
  std::atomic<bool> logged_no_ipc_fence_{false};

  mutable Mutex fence_mu_;
  absl::flat_hash_map<uint64_t, Fence> fences_ ABSL_GUARDED_BY(fence_mu_);
  uint64_t next_fence_id_ ABSL_GUARDED_BY(fence_mu_) = 1;

  Mutex idle_mu_;
  CondVar idle_cv_;
  int64_t in_flight_ ABSL_GUARDED_BY(idle_mu_) = 0;
};

}  // namespace hicache
