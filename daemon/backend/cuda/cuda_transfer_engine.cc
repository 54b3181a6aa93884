#include "daemon/backend/cuda/cuda_transfer_engine.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "daemon/transfer/transfer_task_check.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

constexpr int kD2H = 0;
constexpr int kH2D = 1;
constexpr size_t kMinStagingBytes = 4096;

int DirectionIndex(TransferDirection direction) {
  return direction == TransferDirection::kDeviceToHost ? kD2H : kH2D;
}

}  // namespace

absl::Status CudaTransferEngine::Annotate(const absl::Status& status,
                                          absl::string_view context) {
  return absl::Status(status.code(),
                      absl::StrCat(context, ": ", status.message()));
}

const char* CudaTransferEngine::DirectionName(TransferDirection direction) {
  return direction == TransferDirection::kDeviceToHost ? "device-to-host"
                                                       : "host-to-device";
}

absl::StatusOr<std::unique_ptr<CudaTransferEngine>> CudaTransferEngine::Create(
    cuda::CudaRuntime* runtime, const RankPools* pools,
    TransferListener* listener, CudaTransferEngineOptions options) {
  auto engine = std::make_unique<CudaTransferEngine>(runtime, pools, listener,
                                                     std::move(options));
  if (!engine->setup_status().ok()) return engine->setup_status();
  return engine;
}

CudaTransferEngine::CudaTransferEngine(cuda::CudaRuntime* runtime,
                                       const RankPools* pools,
                                       TransferListener* listener,
                                       CudaTransferEngineOptions options)
    : runtime_(runtime),
      pools_(pools),
      listener_(listener),
      options_(std::move(options)) {
  // The regions of every step, both directions: region bases and strides
  // from the geometry (device: region layout; host: the pool's layout).
  const KvGeometry& geometry = pools_->geometry();
  const RankPoolsOptions& pool_options = pools_->options();
  const uint32_t steps = geometry.NumSteps();
  regions_[kD2H].resize(steps);
  regions_[kH2D].resize(steps);
  bytes_per_pair_.assign(steps, 0);
  for (uint32_t step = 0; step < steps; ++step) {
    for (const auto& [family, layer] : geometry.StepBlocks(step)) {
      const uint64_t block = geometry.BlockBytes(family);
      const uint64_t device_offset = geometry.DeviceOffset(
          pool_options.device_pages_per_rank, 0, family, layer);
      const uint64_t host_offset = geometry.HostOffset(
          pool_options.host_layout, pool_options.host_pages_per_rank, 0, family,
          layer);
      const uint64_t host_stride =
          geometry.PageStride(pool_options.host_layout, family);
      regions_[kD2H][step].push_back(
          cuda::CopyRegion{.src_offset = device_offset,
                           .dst_offset = host_offset,
                           .bytes_per_page = block,
                           .src_stride = block,
                           .dst_stride = host_stride});
      regions_[kH2D][step].push_back(
          cuda::CopyRegion{.src_offset = host_offset,
                           .dst_offset = device_offset,
                           .bytes_per_page = block,
                           .src_stride = host_stride,
                           .dst_stride = block});
      bytes_per_pair_[step] += block;
    }
  }

  lanes_.resize(size_t{pools_->layout().cp_size()} * 2);
  for (Rank rank : pools_->layout().served_ranks()) {
    KvPool* device_pool = pools_->device(rank);
    KvPool* host_pool = pools_->host(rank);
    if (device_pool == nullptr || host_pool == nullptr) continue;
    for (TransferDirection direction :
         {TransferDirection::kDeviceToHost, TransferDirection::kHostToDevice}) {
      auto lane = std::make_unique<Lane>();
      lane->rank = rank;
      lane->direction = direction;
      lane->device_base = device_pool->backend_data();
      lane->host_base = host_pool->backend_data();
      if (rank < options_.device_of_rank.size()) {
        lane->device = options_.device_of_rank[rank];
      }
      if (absl::Status s = SetUpLane(*lane); !s.ok()) {
        if (setup_status_.ok()) setup_status_ = s;
        spdlog::error("CUDA transfer engine: {}", s);
        MutexLock lock(&lane->mu);
        lane->failed = s;
      }
      Lane* raw = lane.get();
      lane->completion = std::thread([this, raw] { CompletionLoop(*raw); });
      lanes_[rank * 2 + DirectionIndex(direction)] = std::move(lane);
    }
  }
}

CudaTransferEngine::~CudaTransferEngine() {
  Drain();
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane == nullptr) continue;
    MutexLock lock(&lane->mu);
    lane->stopping = true;
    lane->work_cv.SignalAll();
  }
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane != nullptr) lane->completion.join();
  }
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane != nullptr) ReleaseLane(*lane);
  }
  MutexLock lock(&fence_mu_);
  for (const auto& [id, fence] : fences_) {
    if (absl::Status s = runtime_->DestroyEvent(fence.event); !s.ok()) {
      spdlog::error("destroying fence {} of rank {}: {}", id, fence.rank, s);
    }
  }
  fences_.clear();
}

absl::Status CudaTransferEngine::SetUpLane(Lane& lane) {
  const std::string what =
      absl::StrCat("rank ", lane.rank, " ", DirectionName(lane.direction),
                   " stream (CUDA device ", lane.device, ")");
  if (lane.device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the rank has no CUDA device in the map"));
  }
  absl::StatusOr<cuda::Stream> stream = runtime_->CreateStream(lane.device);
  if (!stream.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": CreateStream failed: ", stream.status().ToString()));
  }
  lane.stream = *stream;
  if (lane.direction != TransferDirection::kHostToDevice) {
    return absl::OkStatus();
  }
  // The ring of interprocess events stamping loads. Optional: without it
  // loads complete with an empty StepDone::fence.
  for (int i = 0; i < options_.fence_ring_size; ++i) {
    absl::StatusOr<cuda::Event> event =
        runtime_->CreateEvent(lane.device, {.interprocess = true});
    absl::Status failure = event.status();
    if (event.ok()) {
      absl::StatusOr<std::string> handle = runtime_->IpcGetEventHandle(*event);
      if (handle.ok()) {
        lane.fence_ring.push_back({*event, *std::move(handle)});
        continue;
      }
      failure = handle.status();
      if (absl::Status s = runtime_->DestroyEvent(*event); !s.ok()) {
        spdlog::error("{}: destroying an unexportable event: {}", what, s);
      }
    }
    if (!logged_no_ipc_fence_.exchange(true)) {
      spdlog::warn(
          "{}: interprocess events unavailable ({}); {} load fences per "
          "rank, loads complete without a fence when there are none",
          what, failure, lane.fence_ring.size());
    }
    break;
  }
  return absl::OkStatus();
}

void CudaTransferEngine::ReleaseLane(Lane& lane) {
  // The completion thread has exited, so nothing is queued or running.
  if (lane.stream != nullptr) {
    if (absl::Status s = runtime_->SynchronizeStream(lane.stream); !s.ok()) {
      spdlog::warn("rank {} {} stream at shutdown: {}", lane.rank,
                   DirectionName(lane.direction), s);
    }
  }
  MutexLock lock(&lane.mu);
  auto destroy = [&](cuda::Event event) {
    if (absl::Status s = runtime_->DestroyEvent(event); !s.ok()) {
      spdlog::error("rank {}: DestroyEvent: {}", lane.rank, s);
    }
  };
  for (cuda::Event event : lane.free_events) destroy(event);
  lane.free_events.clear();
  for (const IpcFenceEvent& fence : lane.fence_ring) destroy(fence.event);
  lane.fence_ring.clear();
  for (const Staging& staging : lane.free_staging) {
    if (absl::Status s = runtime_->HostFreePinned(staging.data); !s.ok()) {
      spdlog::error("rank {}: HostFreePinned: {}", lane.rank, s);
    }
  }
  lane.free_staging.clear();
  if (lane.stream != nullptr) {
    if (absl::Status s = runtime_->DestroyStream(lane.stream); !s.ok()) {
      spdlog::error("rank {}: DestroyStream: {}", lane.rank, s);
    }
    lane.stream = nullptr;
  }
}

CudaTransferEngine::Lane* CudaTransferEngine::LaneOf(
    Rank rank, TransferDirection direction) const {
  const size_t index = size_t{rank} * 2 + DirectionIndex(direction);
  return index < lanes_.size() ? lanes_[index].get() : nullptr;
}

absl::Status CudaTransferEngine::StreamStatus(
    Rank rank, TransferDirection direction) const {
  Lane* lane = LaneOf(rank, direction);
  if (lane == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("rank ", rank, " has no streams here"));
  }
  MutexLock lock(&lane->mu);
  return lane->failed;
}

absl::Status CudaTransferEngine::Validate(const TransferTask& task) const {
  if (absl::Status valid = CheckTransferTask(*pools_, task); !valid.ok()) {
    return valid;
  }
  for (const RankCopy& copy : task.ranks) {
    if (LaneOf(copy.rank, task.direction) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", copy.rank, " has no copy streams here"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaTransferEngine::AcquireFences(
    const TransferTask& task, std::vector<cuda::Event>& events) {
  events.assign(task.ranks.size(), nullptr);
  MutexLock lock(&fence_mu_);
  for (const RankCopy& copy : task.ranks) {
    if (copy.wait_fence == 0) continue;
    auto it = fences_.find(copy.wait_fence);
    if (it == fences_.end() || it->second.released) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", copy.rank, ": fence ", copy.wait_fence,
                       " is not registered"));
    }
    if (it->second.rank != copy.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", copy.rank, ": fence ", copy.wait_fence,
                       " was registered for rank ", it->second.rank));
    }
  }
  // All valid: take the references (nothing can fail from here on).
  for (size_t i = 0; i < task.ranks.size(); ++i) {
    if (task.ranks[i].wait_fence == 0) continue;
    Fence& fence = fences_[task.ranks[i].wait_fence];
    ++fence.refs;
    events[i] = fence.event;
  }
  return absl::OkStatus();
}

void CudaTransferEngine::DropFenceRef(uint64_t id) {
  cuda::Event destroy = nullptr;
  {
    MutexLock lock(&fence_mu_);
    auto it = fences_.find(id);
    if (it == fences_.end()) return;
    if (--it->second.refs == 0 && it->second.released) {
      destroy = it->second.event;
      fences_.erase(it);
    }
  }
  if (destroy == nullptr) return;
  if (absl::Status s = runtime_->DestroyEvent(destroy); !s.ok()) {
    spdlog::error("destroying released fence {}: {}", id, s);
  }
}

absl::Status CudaTransferEngine::Submit(TransferTask task) {
  if (absl::Status valid = Validate(task); !valid.ok()) return valid;
  std::vector<cuda::Event> fence_events;
  if (absl::Status s = AcquireFences(task, fence_events); !s.ok()) return s;
  {
    MutexLock lock(&idle_mu_);
    in_flight_ += static_cast<int64_t>(task.ranks.size());
  }
  auto shared = std::make_shared<const TransferTask>(std::move(task));
  for (size_t i = 0; i < shared->ranks.size(); ++i) {
    Enqueue(*LaneOf(shared->ranks[i].rank, shared->direction), shared, i,
            fence_events[i]);
  }
  return absl::OkStatus();
}

void CudaTransferEngine::Enqueue(Lane& lane,
                                 std::shared_ptr<const TransferTask> task,
                                 size_t rank_index, cuda::Event fence_event) {
  Pending p;
  p.task = std::move(task);
  p.rank_index = rank_index;
  p.wait_fence = p.task->ranks[rank_index].wait_fence;
  MutexLock lock(&lane.mu);
  if (!lane.failed.ok()) {
    // Fail fast without touching the stream; reported in queue order.
    p.status = absl::FailedPreconditionError(absl::StrCat(
        "rank ", lane.rank, " ", DirectionName(lane.direction),
        " stream is unusable after an earlier error: ", lane.failed.message()));
  } else {
    Issue(lane, p, fence_event);
  }
  lane.pending.push_back(std::move(p));
  lane.work_cv.Signal();
}

void CudaTransferEngine::Issue(Lane& lane, Pending& p,
                               cuda::Event fence_event) {
  const TransferTask& task = *p.task;
  const RankCopy& copy = task.ranks[p.rank_index];
  const bool to_host = task.direction == TransferDirection::kDeviceToHost;
  const std::vector<cuda::CopyRegion>& regions =
      regions_[DirectionIndex(task.direction)][task.step];
  const int64_t num_pages = static_cast<int64_t>(copy.device_pages.size());
  // The context of an error (built only on failure).
  auto where = [&] {
    return absl::StrCat("op ", task.op_id, " step ", task.step, " on rank ",
                        lane.rank, " ", DirectionName(lane.direction),
                        " stream (CUDA device ", lane.device, ")");
  };

  absl::StatusOr<cuda::Event> done = AcquireEvent(lane);
  if (!done.ok()) {
    p.status = Annotate(done.status(), where() + ": CreateEvent");
    return;
  }
  // A failure before anything reads the staging buffer returns it and the
  // event at once.
  auto fail_unlaunched =
      [&](const absl::Status& status, absl::string_view call)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu) {
            p.status = Annotate(status, absl::StrCat(where(), ": ", call));
            lane.free_events.push_back(*done);
            if (p.staging.data != nullptr)
              lane.free_staging.push_back(p.staging);
            p.staging = Staging{};
          };
  if (num_pages > 0) {
    const size_t bytes =
        cuda::PackedCopyBytes(static_cast<int32_t>(regions.size()), num_pages);
    absl::StatusOr<Staging> staging = AcquireStaging(lane, bytes);
    if (!staging.ok())
      return fail_unlaunched(staging.status(), "HostAllocPinned");
    p.staging = *staging;
    // CopyRegion regions[]; int64_t src_pages[]; int64_t dst_pages[].
    char* out = static_cast<char*>(p.staging.data);
    const size_t region_bytes = sizeof(cuda::CopyRegion) * regions.size();
    const size_t list_bytes = sizeof(int64_t) * static_cast<size_t>(num_pages);
    const std::vector<int64_t>& src =
        to_host ? copy.device_pages : copy.host_pages;
    const std::vector<int64_t>& dst =
        to_host ? copy.host_pages : copy.device_pages;
    std::memcpy(out, regions.data(), region_bytes);
    std::memcpy(out + region_bytes, src.data(), list_bytes);
    std::memcpy(out + region_bytes + list_bytes, dst.data(), list_bytes);
  }
  if (fence_event != nullptr) {
    if (absl::Status s = runtime_->StreamWaitEvent(lane.stream, fence_event);
        !s.ok()) {
      return fail_unlaunched(s, "StreamWaitEvent on the fence");
    }
  }
  if (num_pages > 0) {
    const cuda::BatchedPageCopy batch{
        .src_base = to_host ? lane.device_base : lane.host_base,
        .dst_base = to_host ? lane.host_base : lane.device_base,
        .descriptors = p.staging.data,
        .num_regions = static_cast<int32_t>(regions.size()),
        .num_pages = num_pages,
        .max_blocks = options_.max_blocks_per_copy};
    if (absl::Status s = runtime_->LaunchPageCopy(batch, lane.stream);
        !s.ok()) {
      return fail_unlaunched(s, "LaunchPageCopy");
    }
    p.launched = true;
  }
  if (absl::Status s = runtime_->RecordEvent(*done, lane.stream); !s.ok()) {
    // Launched but unobservable through the event: the completion thread
    // synchronizes the stream before recycling the staging buffer.
    p.status = Annotate(s, where() + ": RecordEvent");
    lane.free_events.push_back(*done);
    return;
  }
  p.done = *done;
  if (!to_host && !lane.fence_ring.empty()) {
    const IpcFenceEvent& fence =
        lane.fence_ring[lane.next_fence++ % lane.fence_ring.size()];
    if (absl::Status s = runtime_->RecordEvent(fence.event, lane.stream);
        !s.ok()) {
      p.status = Annotate(s, where() + ": RecordEvent of the load fence");
      return;
    }
    p.fence = fence.handle;
  }
  p.bytes = static_cast<uint64_t>(num_pages) * bytes_per_pair_[task.step];
}

absl::StatusOr<CudaTransferEngine::Staging> CudaTransferEngine::AcquireStaging(
    Lane& lane, size_t bytes) {
  // Best fit among the free buffers; none is ever freed before shutdown
  // (freeing pinned memory synchronizes the device in real CUDA). Sizes are
  // powers of two, so the list stays short.
  auto best = lane.free_staging.end();
  for (auto it = lane.free_staging.begin(); it != lane.free_staging.end();
       ++it) {
    if (it->capacity >= bytes &&
        (best == lane.free_staging.end() || it->capacity < best->capacity)) {
      best = it;
    }
  }
  if (best != lane.free_staging.end()) {
    Staging staging = *best;
    *best = lane.free_staging.back();
    lane.free_staging.pop_back();
    return staging;
  }
  const size_t capacity = std::bit_ceil(std::max(bytes, kMinStagingBytes));
  absl::StatusOr<void*> data = runtime_->HostAllocPinned(capacity);
  if (!data.ok()) return data.status();
  return Staging{*data, capacity};
}

absl::StatusOr<cuda::Event> CudaTransferEngine::AcquireEvent(Lane& lane) {
  if (!lane.free_events.empty()) {
    cuda::Event event = lane.free_events.back();
    lane.free_events.pop_back();
    return event;
  }
  return runtime_->CreateEvent(lane.device, cuda::EventOptions{});
}

void CudaTransferEngine::CompletionLoop(Lane& lane) {
  while (true) {
    Pending p;
    {
      MutexLock lock(&lane.mu);
      while (lane.pending.empty() && !lane.stopping)
        lane.work_cv.Wait(&lane.mu);
      if (lane.pending.empty()) return;  // Stopping and drained.
      p = std::move(lane.pending.front());
      lane.pending.pop_front();
    }
    // Block (without locks) until the step's work has completed.
    absl::Status sync;
    if (p.done != nullptr) {
      sync = runtime_->SynchronizeEvent(p.done);
    } else if (p.launched) {
      sync = runtime_->SynchronizeStream(lane.stream);
    }
    const TransferTask& task = *p.task;
    const RankCopy& copy = task.ranks[p.rank_index];
    absl::Status status = p.status;
    {
      MutexLock lock(&lane.mu);
      if (!sync.ok()) {
        const absl::Status error = Annotate(
            sync, absl::StrCat("op ", task.op_id, " step ", task.step,
                               " on rank ", lane.rank, " ",
                               DirectionName(lane.direction), " stream"));
        if (lane.failed.ok()) {
          lane.failed = error;
          spdlog::error("CUDA copy failed, the stream is now unusable: {}",
                        error);
        }
        if (status.ok()) status = error;
      } else if (status.ok() && !lane.failed.ok()) {
        // Enqueued behind the failed work on a broken stream: its bytes
        // cannot be trusted whatever the event says.
        status = absl::FailedPreconditionError(
            absl::StrCat("rank ", lane.rank, " ", DirectionName(lane.direction),
                         " stream is unusable after an earlier error: ",
                         lane.failed.message()));
      }
      if (p.done != nullptr) lane.free_events.push_back(p.done);
      if (p.staging.data != nullptr) lane.free_staging.push_back(p.staging);
    }
    if (p.wait_fence != 0) DropFenceRef(p.wait_fence);
    StepDone done{.op_id = task.op_id,
                  .direction = task.direction,
                  .rank = copy.rank,
                  .step = task.step,
                  .status = status,
                  .bytes = status.ok() ? p.bytes : 0,
                  .fence = status.ok() ? std::move(p.fence) : std::string()};
    listener_->OnStepDone(std::move(done));
    MutexLock lock(&idle_mu_);
    if (--in_flight_ == 0) idle_cv_.SignalAll();
  }
}

void CudaTransferEngine::Drain() {
  MutexLock lock(&idle_mu_);
  while (in_flight_ > 0) idle_cv_.Wait(&idle_mu_);
}

absl::StatusOr<uint64_t> CudaTransferEngine::RegisterFence(
    Rank rank, const std::string& handle) {
  if (handle.size() != cuda::kIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": a fence handle has ",
                     cuda::kIpcHandleBytes, " bytes, got ", handle.size()));
  }
  Lane* lane = LaneOf(rank, TransferDirection::kDeviceToHost);
  if (lane == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " has no device and host pool here"));
  }
  if (lane->device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " has no CUDA device"));
  }
  absl::StatusOr<cuda::Event> event =
      runtime_->IpcOpenEventHandle(lane->device, handle);
  if (!event.ok()) {
    return Annotate(event.status(), absl::StrCat("rank ", rank,
                                                 ": IpcOpenEventHandle on CUDA "
                                                 "device ",
                                                 lane->device));
  }
  MutexLock lock(&fence_mu_);
  const uint64_t id = next_fence_id_++;
  fences_[id] = Fence{.rank = rank, .event = *event};
  return id;
}

absl::Status CudaTransferEngine::ReleaseFence(uint64_t id) {
  cuda::Event destroy = nullptr;
  {
    MutexLock lock(&fence_mu_);
    auto it = fences_.find(id);
    if (it == fences_.end() || it->second.released) {
      return absl::NotFoundError(absl::StrCat("no fence ", id));
    }
    if (it->second.refs > 0) {
      it->second.released = true;  // The last step waiting on it destroys it.
      return absl::OkStatus();
    }
    destroy = it->second.event;
    fences_.erase(it);
  }
  // The id is gone either way; a failed destroy only leaks the event.
  if (absl::Status s = runtime_->DestroyEvent(destroy); !s.ok()) {
    spdlog::error("destroying fence {}: {}", id, s);
  }
  return absl::OkStatus();
}

absl::StatusOr<Rank> CudaTransferEngine::FenceRank(uint64_t id) const {
  ReaderMutexLock lock(&fence_mu_);
  auto it = fences_.find(id);
  if (it == fences_.end() || it->second.released) {
    return absl::NotFoundError(absl::StrCat("no fence ", id));
  }
  return it->second.rank;
}

}  // namespace hicache
