#pragma once

// Internals of SimCudaRuntime shared by sim_cuda_runtime.cc (memory) and
// sim_cuda_streams.cc (streams, events, work). Include nowhere else.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/core/mutex.h"

namespace hicache::cuda {
namespace sim {

// A unit of stream work. It runs on the stream's thread and is given the
// stream's sticky error (OK while none); a non-OK result fails the stream.
using Work = absl::AnyInvocable<absl::Status(const absl::Status& stream_error)>;

// The completion flag behind an event (shared by the event, its IPC aliases
// and the markers of its pending records). Every record is a generation;
// generation 0 ("never recorded") is complete.
class EventState {
 public:
  struct Snapshot {
    bool recorded = false;
    bool complete = false;
    absl::Status status;
    absl::Time completed_at;
  };

  // Starts a new generation (a record) and returns it.
  uint64_t Record() ABSL_LOCKS_EXCLUDED(mu_);
  // The latest generation (0: never recorded).
  uint64_t Latest() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `generation` complete, with the status of its stream.
  void Complete(uint64_t generation, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until `generation` is complete; the status it completed with.
  absl::Status Wait(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // The latest generation's state.
  Snapshot Query() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Mutex mu_;
  CondVar completed_;
  uint64_t last_recorded_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  // The highest completed generation, its status and completion time.
  uint64_t last_completed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time completed_at_ ABSL_GUARDED_BY(mu_);
};

// The process-wide table of IPC-exported events (across runtimes).
uint64_t RegisterIpcEvent(std::shared_ptr<EventState> state);
void UnregisterIpcEvent(uint64_t id);
std::shared_ptr<EventState> FindIpcEvent(uint64_t id);

}  // namespace sim

// An ordered work queue run by one thread.
class SimCudaRuntime::SimStream {
 public:
  // `delay_ns`: sleep before each item; must outlive the stream.
  SimStream(int device, const std::atomic<int64_t>* delay_ns);
  // Runs the queued work, then stops the thread.
  ~SimStream() ABSL_LOCKS_EXCLUDED(mu_);
  SimStream(const SimStream&) = delete;
  SimStream& operator=(const SimStream&) = delete;

  int device() const { return device_; }
  void Enqueue(sim::Work work) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every queued item ran; the sticky error.
  absl::Status Drain() ABSL_LOCKS_EXCLUDED(mu_);
  // Drain(), then clears the sticky error.
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const int device_;
  const std::atomic<int64_t>* const delay_ns_;
  Mutex mu_;
  CondVar work_available_;  // Signaled on Enqueue and stop.
  CondVar idle_;            // Signaled after every item.
  std::deque<sim::Work> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // An item is executing.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // Last: starts once the rest is constructed.
};

struct SimCudaRuntime::SimEvent {
  int device = 0;
  EventOptions options;
  std::shared_ptr<sim::EventState> state;
  uint64_t ipc_id = 0;       // Interprocess events: the exported id.
  bool owns_ipc_id = false;  // False for events from IpcOpenEventHandle.
};

}  // namespace hicache::cuda
