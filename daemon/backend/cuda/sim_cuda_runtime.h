#pragma once

// SimCudaRuntime: a CudaRuntime without a GPU, for CI and tests.
//
//   * Device memory is host RAM in POSIX shared memory (one segment per
//     allocation, "/hicache-sim-<pid>-<n>"), so IpcGetMemHandle names the
//     segment and IpcOpenMemHandle maps it, in this or another process.
//     Allocations are counted per device against SimOptions's capacity
//     (RESOURCE_EXHAUSTED beyond it, before any memory is touched).
//   * A stream is an ordered work queue with one worker thread; an event is a
//     completion flag with generations (each RecordEvent a new one).
//   * The "kernel" (LaunchPageCopy) does on the stream's thread what the CUDA
//     kernel does, reading the descriptors when it runs. Like a GPU, it may
//     touch only device-accessible memory: device allocations, IPC-mapped
//     segments, registered and pinned host memory (adjacent ranges count as
//     one). Addresses outside them fail the stream ("illegal address")
//     instead of corrupting memory; LaunchPageCopy itself refuses descriptors
//     outside them. MemcpyAsync, like cudaMemcpyDefault, takes any pointers.
//   * Errors of asynchronous work are sticky for their stream, like a CUDA
//     context error: the failed work and every later copy of the stream are
//     skipped (destinations untouched), every later event recorded on it
//     completes with the error, SynchronizeStream reports it, and a stream
//     that waits (StreamWaitEvent) for such an event fails with it too.
//     ResetStream clears it (the simulation only; CUDA needs a new context).
//   * IPC events work within one process (across SimCudaRuntime instances
//     too); IpcOpenEventHandle of another process's handle is UNIMPLEMENTED.
//
// Thread-safe. Destroying a stream, and the runtime, drains the queued work.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/core/mutex.h"

namespace hicache::cuda {

struct SimOptions {
  int devices = 1;
  uint64_t device_total_bytes = 80ull << 30;
  int multiprocessors = 132;
};

// Calls InjectFault can make fail.
enum class SimFault {
  kLaunch,        // LaunchPageCopy returns the error; nothing is enqueued.
  kAsyncCopy,     // LaunchPageCopy / MemcpyAsync is accepted but fails when
                  // it runs: the stream fails, the destination is untouched.
  kRecordEvent,   // RecordEvent returns the error; nothing is recorded.
  kStreamWait,    // StreamWaitEvent returns the error; nothing is enqueued.
  kEventQuery,    // QueryEvent or SynchronizeEvent returns the error.
  kDeviceMalloc,  // DeviceMalloc returns the error.
  kHostRegister,  // HostRegister returns the error.
  kIpcOpenEvent,  // IpcOpenEventHandle returns the error.
};
inline constexpr int kNumSimFaults = 8;

class SimCudaRuntime final : public CudaRuntime {
 public:
  explicit SimCudaRuntime(SimOptions options = {});
  ~SimCudaRuntime() override;
  SimCudaRuntime(const SimCudaRuntime&) = delete;
  SimCudaRuntime& operator=(const SimCudaRuntime&) = delete;

  std::string name() const override { return "simulated"; }
  absl::StatusOr<int> DeviceCount() override { return options_.devices; }
  absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) override
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<void*> DeviceMalloc(int device, size_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeviceFree(int device, void* ptr) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Memset(void* device_ptr, int value, size_t bytes) override;
  absl::Status CopyToDevice(void* device_dst, const void* host_src,
                            size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* device_src,
                          size_t bytes) override;
  absl::StatusOr<std::string> IpcGetMemHandle(void* device_ptr) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<void*> IpcOpenMemHandle(int device,
                                         const std::string& handle) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status IpcCloseMemHandle(void* device_ptr) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HostRegister(void* ptr, size_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HostUnregister(void* ptr) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<void*> HostAllocPinned(size_t bytes) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status HostFreePinned(void* ptr) override ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<Stream> CreateStream(int device) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DestroyStream(Stream stream) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SynchronizeStream(Stream stream) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Event> CreateEvent(int device, EventOptions options) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DestroyEvent(Event event) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RecordEvent(Event event, Stream stream) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StreamWaitEvent(Stream stream, Event event) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SynchronizeEvent(Event event) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> QueryEvent(Event event) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<float> ElapsedMs(Event start, Event end) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> IpcGetEventHandle(Event event) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Event> IpcOpenEventHandle(int device,
                                           const std::string& handle) override
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes,
                           Stream stream) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status LaunchPageCopy(const BatchedPageCopy& copy,
                              Stream stream) override ABSL_LOCKS_EXCLUDED(mu_);

  // --- Simulation only -------------------------------------------------------
  // The next `count` calls of that kind fail with `status` (counts add up;
  // the latest status is used). A count <= 0 clears the kind's faults.
  void InjectFault(SimFault fault, int count = 1,
                   absl::Status status = absl::InternalError("injected fault"))
      ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for the stream's queued work, then clears its sticky error.
  absl::Status ResetStream(Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Every work item (copy, record, wait) sleeps this long before it runs.
  void SetWorkDelay(absl::Duration delay);
  // Accepted LaunchPageCopy calls with work (regions and pages) to do, and
  // accepted MemcpyAsync calls (injected asynchronous faults included).
  int64_t launches() const { return launches_.load(); }
  int64_t memcpys() const { return memcpys_.load(); }

 private:
  class SimStream;
  struct SimEvent;
  struct MemRange {
    enum class Kind { kDevice, kIpcMapped, kRegistered, kPinned };
    Kind kind = Kind::kDevice;
    size_t bytes = 0;         // As asked for.
    size_t mapped_bytes = 0;  // What mmap/alloc covers (>= 1).
    int device = -1;          // kDevice and kIpcMapped.
    std::string shm_name;     // kDevice and kIpcMapped.
  };
  // [begin, end) of device-accessible memory.
  struct Span {
    uintptr_t begin = 0;
    uintptr_t end = 0;
  };

  absl::Status TakeFault(SimFault fault) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckDevice(int device) const;
  absl::StatusOr<SimStream*> FindStream(Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<SimEvent*> FindEvent(Event event) ABSL_LOCKS_EXCLUDED(mu_);
  // The range holding [ptr, ptr + bytes) (with its adjacent ranges merged).
  std::map<uintptr_t, MemRange>::const_iterator RangeOf(const void* ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Span> AccessibleSpan(const void* ptr, size_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What the kernel does, on the stream's thread.
  absl::Status RunPageCopy(const BatchedPageCopy& copy)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Adds a range unless it overlaps one (ALREADY_EXISTS).
  absl::Status AddRange(void* ptr, MemRange range)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SimOptions options_;
  std::atomic<int64_t> launches_{0};
  std::atomic<int64_t> memcpys_{0};
  std::atomic<int64_t> work_delay_ns_{0};

  mutable Mutex mu_;
  std::map<uintptr_t, MemRange> memory_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> allocated_ ABSL_GUARDED_BY(mu_);  // Per device.
  absl::flat_hash_map<SimStream*, std::unique_ptr<SimStream>> streams_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<SimEvent*, std::unique_ptr<SimEvent>> events_
      ABSL_GUARDED_BY(mu_);
  struct PendingFault {
    int count = 0;
    absl::Status status;
  };
  std::array<PendingFault, kNumSimFaults> faults_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::cuda
