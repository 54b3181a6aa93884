// SimCudaRuntime: streams, events and the work they run.
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "daemon/backend/cuda/sim_cuda_internal.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"

namespace hicache::cuda {
namespace sim {

// --- EventState --------------------------------------------------------------

uint64_t EventState::Record() {
  MutexLock lock(&mu_);
  const uint64_t generation = ++last_recorded_;
  pending_.insert(generation);
  return generation;
}

uint64_t EventState::Latest() {
  MutexLock lock(&mu_);
  return last_recorded_;
}

void EventState::Complete(uint64_t generation, absl::Status status) {
  MutexLock lock(&mu_);
  pending_.erase(generation);
  if (generation > last_completed_) {
    last_completed_ = generation;
    status_ = std::move(status);
    completed_at_ = absl::Now();
  }
  completed_.SignalAll();
}

absl::Status EventState::Wait(uint64_t generation) {
  MutexLock lock(&mu_);
  while (pending_.contains(generation)) completed_.Wait(&mu_);
  return status_;
}

EventState::Snapshot EventState::Query() {
  MutexLock lock(&mu_);
  Snapshot snapshot;
  snapshot.recorded = last_recorded_ > 0;
  snapshot.complete = !pending_.contains(last_recorded_);
  snapshot.status = status_;
  snapshot.completed_at = completed_at_;
  return snapshot;
}

// --- The IPC event table -----------------------------------------------------

namespace {

struct IpcEventTable {
  Mutex mu;
  absl::flat_hash_map<uint64_t, std::weak_ptr<EventState>> events
      ABSL_GUARDED_BY(mu);
  absl::BitGen random ABSL_GUARDED_BY(mu);
};

IpcEventTable& Table() {
  static auto* table = new IpcEventTable();  // Never destroyed.
  return *table;
}

}  // namespace

uint64_t RegisterIpcEvent(std::shared_ptr<EventState> state) {
  IpcEventTable& table = Table();
  MutexLock lock(&table.mu);
  uint64_t id = 0;
  while (id == 0 || table.events.contains(id)) {
    id = absl::Uniform<uint64_t>(table.random);
  }
  table.events.emplace(id, std::move(state));
  return id;
}

void UnregisterIpcEvent(uint64_t id) {
  IpcEventTable& table = Table();
  MutexLock lock(&table.mu);
  table.events.erase(id);
}

std::shared_ptr<EventState> FindIpcEvent(uint64_t id) {
  IpcEventTable& table = Table();
  MutexLock lock(&table.mu);
  auto it = table.events.find(id);
  return it == table.events.end() ? nullptr : it->second.lock();
}

}  // namespace sim

namespace {

constexpr char kEventMagic[16] = "hicache-sim-evt";

// The layout of a simulated IPC event handle (zero padded to 64 bytes).
struct EventHandle {
  char magic[16];
  int64_t pid;
  uint64_t id;
};
static_assert(sizeof(EventHandle) <= kIpcHandleBytes);

}  // namespace

// --- SimStream ---------------------------------------------------------------

SimCudaRuntime::SimStream::SimStream(int device,
                                     const std::atomic<int64_t>* delay_ns)
    : device_(device), delay_ns_(delay_ns), thread_([this] { Run(); }) {}

SimCudaRuntime::SimStream::~SimStream() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    work_available_.SignalAll();
  }
  thread_.join();
}

void SimCudaRuntime::SimStream::Enqueue(sim::Work work) {
  MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
  work_available_.Signal();
}

absl::Status SimCudaRuntime::SimStream::Drain() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || running_) idle_.Wait(&mu_);
  return error_;
}

void SimCudaRuntime::SimStream::Reset() {
  MutexLock lock(&mu_);
  while (!queue_.empty() || running_) idle_.Wait(&mu_);
  error_ = absl::OkStatus();
}

void SimCudaRuntime::SimStream::Run() {
  for (;;) {
    sim::Work work;
    absl::Status error;
    {
      MutexLock lock(&mu_);
      while (queue_.empty() && !stop_) work_available_.Wait(&mu_);
      if (queue_.empty()) return;  // Stopped and drained.
      work = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      error = error_;
    }
    if (const int64_t delay = delay_ns_->load(); delay > 0) {
      absl::SleepFor(absl::Nanoseconds(delay));
    }
    absl::Status result = work(error);
    work = nullptr;  // Release what it holds before reporting idle.
    MutexLock lock(&mu_);
    if (!result.ok() && error_.ok()) error_ = std::move(result);
    running_ = false;
    idle_.SignalAll();
  }
}

// --- Streams -----------------------------------------------------------------

absl::StatusOr<SimCudaRuntime::SimStream*> SimCudaRuntime::FindStream(
    Stream stream) {
  auto* key = reinterpret_cast<SimStream*>(stream);
  MutexLock lock(&mu_);
  if (!streams_.contains(key)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown simulated stream %p", stream));
  }
  return key;
}

absl::StatusOr<SimCudaRuntime::SimEvent*> SimCudaRuntime::FindEvent(
    Event event) {
  auto* key = reinterpret_cast<SimEvent*>(event);
  MutexLock lock(&mu_);
  if (!events_.contains(key)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown simulated event %p", event));
  }
  return key;
}

absl::StatusOr<Stream> SimCudaRuntime::CreateStream(int device) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  auto stream = std::make_unique<SimStream>(device, &work_delay_ns_);
  SimStream* key = stream.get();
  MutexLock lock(&mu_);
  streams_.emplace(key, std::move(stream));
  return reinterpret_cast<Stream>(key);
}

absl::Status SimCudaRuntime::DestroyStream(Stream stream) {
  std::unique_ptr<SimStream> owned;
  {
    MutexLock lock(&mu_);
    auto it = streams_.find(reinterpret_cast<SimStream*>(stream));
    if (it == streams_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "DestroyStream: unknown simulated stream %p", stream));
    }
    owned = std::move(it->second);
    streams_.erase(it);
  }
  owned.reset();  // Drains the queue, outside the lock.
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::SynchronizeStream(Stream stream) {
  absl::StatusOr<SimStream*> s = FindStream(stream);
  if (!s.ok()) return s.status();
  return (*s)->Drain();
}

absl::Status SimCudaRuntime::ResetStream(Stream stream) {
  absl::StatusOr<SimStream*> s = FindStream(stream);
  if (!s.ok()) return s.status();
  (*s)->Reset();
  return absl::OkStatus();
}

// --- Events ------------------------------------------------------------------

absl::StatusOr<Event> SimCudaRuntime::CreateEvent(int device,
                                                  EventOptions options) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (options.interprocess && options.timing) {
    return absl::InvalidArgumentError(
        "an interprocess event cannot be a timing event (as in CUDA)");
  }
  auto event = std::make_unique<SimEvent>();
  event->device = device;
  event->options = options;
  event->state = std::make_shared<sim::EventState>();
  if (options.interprocess) {
    event->ipc_id = sim::RegisterIpcEvent(event->state);
    event->owns_ipc_id = true;
  }
  SimEvent* key = event.get();
  MutexLock lock(&mu_);
  events_.emplace(key, std::move(event));
  return reinterpret_cast<Event>(key);
}

absl::Status SimCudaRuntime::DestroyEvent(Event event) {
  std::unique_ptr<SimEvent> owned;
  {
    MutexLock lock(&mu_);
    auto it = events_.find(reinterpret_cast<SimEvent*>(event));
    if (it == events_.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("DestroyEvent: unknown simulated event %p", event));
    }
    owned = std::move(it->second);
    events_.erase(it);
  }
  // Pending records keep the state alive; their markers still complete it.
  if (owned->owns_ipc_id) sim::UnregisterIpcEvent(owned->ipc_id);
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::RecordEvent(Event event, Stream stream) {
  if (absl::Status s = TakeFault(SimFault::kRecordEvent); !s.ok()) return s;
  absl::StatusOr<SimEvent*> e = FindEvent(event);
  if (!e.ok()) return e.status();
  absl::StatusOr<SimStream*> s = FindStream(stream);
  if (!s.ok()) return s.status();
  if ((*e)->device != (*s)->device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordEvent: the event is on device ", (*e)->device,
                     ", the stream on device ", (*s)->device()));
  }
  std::shared_ptr<sim::EventState> state = (*e)->state;
  const uint64_t generation = state->Record();
  (*s)->Enqueue(
      [state = std::move(state), generation](const absl::Status& stream_error) {
        state->Complete(generation, stream_error);
        return absl::OkStatus();
      });
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::StreamWaitEvent(Stream stream, Event event) {
  if (absl::Status s = TakeFault(SimFault::kStreamWait); !s.ok()) return s;
  absl::StatusOr<SimEvent*> e = FindEvent(event);
  if (!e.ok()) return e.status();
  absl::StatusOr<SimStream*> s = FindStream(stream);
  if (!s.ok()) return s.status();
  std::shared_ptr<sim::EventState> state = (*e)->state;
  const uint64_t generation = state->Latest();
  if (generation == 0) return absl::OkStatus();  // Never recorded: complete.
  (*s)->Enqueue(
      [state = std::move(state), generation](const absl::Status& stream_error) {
        if (!stream_error.ok()) return stream_error;
        return state->Wait(generation);  // Its failure fails this stream too.
      });
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::SynchronizeEvent(Event event) {
  if (absl::Status s = TakeFault(SimFault::kEventQuery); !s.ok()) return s;
  absl::StatusOr<SimEvent*> e = FindEvent(event);
  if (!e.ok()) return e.status();
  sim::EventState& state = *(*e)->state;
  return state.Wait(state.Latest());
}

absl::StatusOr<bool> SimCudaRuntime::QueryEvent(Event event) {
  if (absl::Status s = TakeFault(SimFault::kEventQuery); !s.ok()) return s;
  absl::StatusOr<SimEvent*> e = FindEvent(event);
  if (!e.ok()) return e.status();
  const sim::EventState::Snapshot snapshot = (*e)->state->Query();
  if (!snapshot.complete) return false;
  if (!snapshot.status.ok()) return snapshot.status;
  return true;
}

absl::StatusOr<float> SimCudaRuntime::ElapsedMs(Event start, Event end) {
  sim::EventState::Snapshot snapshots[2];
  Event events[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<SimEvent*> e = FindEvent(events[i]);
    if (!e.ok()) return e.status();
    if (!(*e)->options.timing) {
      return absl::InvalidArgumentError(
          "ElapsedMs: both events must be created with timing");
    }
    snapshots[i] = (*e)->state->Query();
    if (!snapshots[i].recorded) {
      return absl::InvalidArgumentError(
          "ElapsedMs: an event was never recorded");
    }
    if (!snapshots[i].complete) {
      return absl::FailedPreconditionError(
          "ElapsedMs: an event has not completed yet");
    }
    if (!snapshots[i].status.ok()) return snapshots[i].status;
  }
  return static_cast<float>(absl::ToDoubleMilliseconds(
      snapshots[1].completed_at - snapshots[0].completed_at));
}

absl::StatusOr<std::string> SimCudaRuntime::IpcGetEventHandle(Event event) {
  absl::StatusOr<SimEvent*> e = FindEvent(event);
  if (!e.ok()) return e.status();
  if (!(*e)->options.interprocess) {
    return absl::InvalidArgumentError(
        "IpcGetEventHandle: the event was not created interprocess");
  }
  EventHandle fields{};
  std::memcpy(fields.magic, kEventMagic, sizeof(kEventMagic));
  fields.pid = getpid();
  fields.id = (*e)->ipc_id;
  std::string handle(kIpcHandleBytes, '\0');
  std::memcpy(handle.data(), &fields, sizeof(fields));
  return handle;
}

absl::StatusOr<Event> SimCudaRuntime::IpcOpenEventHandle(
    int device, const std::string& handle) {
  if (absl::Status s = TakeFault(SimFault::kIpcOpenEvent); !s.ok()) return s;
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  EventHandle fields;
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(
        "IpcOpenEventHandle: not a simulated IPC event handle");
  }
  std::memcpy(&fields, handle.data(), sizeof(fields));
  if (std::memcmp(fields.magic, kEventMagic, sizeof(kEventMagic)) != 0) {
    return absl::InvalidArgumentError(
        "IpcOpenEventHandle: not a simulated IPC event handle");
  }
  if (fields.pid != getpid()) {
    return absl::UnimplementedError(absl::StrCat(
        "simulated IPC events open only in the process that created them "
        "(created by pid ",
        fields.pid, ", opened in pid ", getpid(), ")"));
  }
  std::shared_ptr<sim::EventState> state = sim::FindIpcEvent(fields.id);
  if (state == nullptr) {
    return absl::NotFoundError(
        "IpcOpenEventHandle: the exported event no longer exists");
  }
  auto event = std::make_unique<SimEvent>();
  event->device = device;
  event->options.interprocess = true;
  event->state = std::move(state);
  event->ipc_id = fields.id;
  SimEvent* key = event.get();
  MutexLock lock(&mu_);
  events_.emplace(key, std::move(event));
  return reinterpret_cast<Event>(key);
}

// --- Work --------------------------------------------------------------------

absl::Status SimCudaRuntime::MemcpyAsync(void* dst, const void* src,
                                         size_t bytes, Stream stream) {
  absl::StatusOr<SimStream*> s = FindStream(stream);
  if (!s.ok()) return s.status();
  if (bytes > 0 && (dst == nullptr || src == nullptr)) {
    return absl::InvalidArgumentError("MemcpyAsync: null pointer");
  }
  absl::Status fault = TakeFault(SimFault::kAsyncCopy);
  memcpys_.fetch_add(1);
  (*s)->Enqueue([dst, src, bytes,
                 fault = std::move(fault)](const absl::Status& stream_error) {
    if (!stream_error.ok()) return stream_error;
    if (!fault.ok()) return fault;
    if (bytes > 0) std::memmove(dst, src, bytes);
    return absl::OkStatus();
  });
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::LaunchPageCopy(const BatchedPageCopy& copy,
                                            Stream stream) {
  if (absl::Status s = TakeFault(SimFault::kLaunch); !s.ok()) return s;
  absl::StatusOr<SimStream*> s = FindStream(stream);
  if (!s.ok()) return s.status();
  if (copy.num_regions < 0 || copy.num_pages < 0 || copy.max_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LaunchPageCopy: negative count (num_regions ", copy.num_regions,
        ", num_pages ", copy.num_pages, ", max_blocks ", copy.max_blocks, ")"));
  }
  if (copy.num_regions == 0 || copy.num_pages == 0) {
    return absl::OkStatus();  // Nothing to copy; no launch.
  }
  if (copy.src_base == nullptr || copy.dst_base == nullptr ||
      copy.descriptors == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchPageCopy: src_base, dst_base and descriptors must be non-null "
        "when there are pages to copy");
  }
  if (reinterpret_cast<uintptr_t>(copy.src_base) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(copy.dst_base) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(copy.descriptors) % 8 != 0) {
    return absl::InvalidArgumentError(
        "LaunchPageCopy: src_base and dst_base must be 4-byte aligned, "
        "descriptors 8-byte aligned");
  }
  const size_t descriptor_bytes =
      PackedCopyBytes(copy.num_regions, copy.num_pages);
  if (absl::StatusOr<Span> span =
          AccessibleSpan(copy.descriptors, descriptor_bytes);
      !span.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("LaunchPageCopy: descriptors: ", span.status().message()));
  }
  if (absl::Status valid =
          ValidateRegions(static_cast<const CopyRegion*>(copy.descriptors),
                          copy.num_regions, copy.num_pages);
      !valid.ok()) {
    return valid;
  }
  absl::Status fault = TakeFault(SimFault::kAsyncCopy);
  launches_.fetch_add(1);
  (*s)->Enqueue(
      [this, copy, fault = std::move(fault)](const absl::Status& stream_error) {
        if (!stream_error.ok()) return stream_error;
        if (!fault.ok()) return fault;
        return RunPageCopy(copy);
      });
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::RunPageCopy(const BatchedPageCopy& copy) {
  auto illegal = [](absl::string_view what, const absl::Status& status) {
    return absl::InternalError(absl::StrCat(
        "simulated kernel: illegal address (", what, "): ", status.message()));
  };
  const int64_t num_pages = copy.num_pages;
  absl::StatusOr<Span> descriptors = AccessibleSpan(
      copy.descriptors, PackedCopyBytes(copy.num_regions, num_pages));
  if (!descriptors.ok()) return illegal("descriptors", descriptors.status());
  absl::StatusOr<Span> src = AccessibleSpan(copy.src_base, 1);
  if (!src.ok()) return illegal("src_base", src.status());
  absl::StatusOr<Span> dst = AccessibleSpan(copy.dst_base, 1);
  if (!dst.ok()) return illegal("dst_base", dst.status());

  // Read now, as the kernel would; checked again since it may have changed.
  const auto* regions = static_cast<const CopyRegion*>(copy.descriptors);
  const auto* src_pages =
      reinterpret_cast<const int64_t*>(regions + copy.num_regions);
  const int64_t* dst_pages = src_pages + num_pages;
  if (absl::Status valid =
          ValidateRegions(regions, copy.num_regions, num_pages);
      !valid.ok()) {
    return valid;
  }
  // The byte range one page of a region touches, within `span`.
  auto page_address = [](const void* base, uint64_t offset, int64_t page,
                         uint64_t stride, uint64_t bytes,
                         const Span& span) -> char* {
    const __int128 at =
        static_cast<__int128>(reinterpret_cast<uintptr_t>(base)) + offset +
        static_cast<__int128>(page) * stride;
    if (at < span.begin || at + bytes > span.end) return nullptr;
    return reinterpret_cast<char*>(static_cast<uintptr_t>(at));
  };
  for (int32_t r = 0; r < copy.num_regions; ++r) {
    const CopyRegion region = regions[r];
    for (int64_t i = 0; i < num_pages; ++i) {
      const char* from =
          page_address(copy.src_base, region.src_offset, src_pages[i],
                       region.src_stride, region.bytes_per_page, *src);
      char* to = page_address(copy.dst_base, region.dst_offset, dst_pages[i],
                              region.dst_stride, region.bytes_per_page, *dst);
      if (from == nullptr || to == nullptr) {
        return absl::InternalError(absl::StrCat(
            "simulated kernel: illegal address: region ", r, " pair ", i,
            " (src page ", src_pages[i], ", dst page ", dst_pages[i], ") ",
            from == nullptr ? "reads" : "writes",
            " outside the device-accessible memory at its base"));
      }
      std::memmove(to, from, region.bytes_per_page);
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache::cuda
