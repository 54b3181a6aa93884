#include "daemon/backend/cuda/sim_cuda_runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/backend/cuda/sim_cuda_internal.h"

namespace hicache::cuda {
namespace {

constexpr char kMemMagic[16] = "hicache-sim-mem";
constexpr size_t kPinnedAlignment = 64;

absl::Status ErrnoError(int err, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOMEM || err == ENOSPC || err == EAGAIN) {
    return absl::ResourceExhaustedError(message);
  }
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::InternalError(message);
}

std::string NewSegmentName() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat("/hicache-sim-", getpid(), "-", counter.fetch_add(1));
}

uintptr_t Address(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); }

}  // namespace

SimCudaRuntime::SimCudaRuntime(SimOptions options)
    : options_(options),
      allocated_(options.devices > 0 ? options.devices : 0, 0) {}

SimCudaRuntime::~SimCudaRuntime() {
  // Streams first: draining them runs the work that may touch the memory.
  absl::flat_hash_map<SimStream*, std::unique_ptr<SimStream>> streams;
  absl::flat_hash_map<SimEvent*, std::unique_ptr<SimEvent>> events;
  std::map<uintptr_t, MemRange> memory;
  {
    MutexLock lock(&mu_);
    streams.swap(streams_);
  }
  streams.clear();
  {
    MutexLock lock(&mu_);
    events.swap(events_);
    memory.swap(memory_);
  }
  for (const auto& [ptr, event] : events) {
    if (event->owns_ipc_id) sim::UnregisterIpcEvent(event->ipc_id);
  }
  for (const auto& [begin, range] : memory) {
    void* ptr = reinterpret_cast<void*>(begin);
    switch (range.kind) {
      case MemRange::Kind::kDevice:
        munmap(ptr, range.mapped_bytes);
        shm_unlink(range.shm_name.c_str());
        break;
      case MemRange::Kind::kIpcMapped:
        munmap(ptr, range.mapped_bytes);
        break;
      case MemRange::Kind::kPinned:
        std::free(ptr);
        break;
      case MemRange::Kind::kRegistered:
        break;
    }
  }
}

absl::Status SimCudaRuntime::CheckDevice(int device) const {
  if (device < 0 || device >= options_.devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulated device ", device, " does not exist (",
                     options_.devices, " devices)"));
  }
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::TakeFault(SimFault fault) {
  MutexLock lock(&mu_);
  PendingFault& pending = faults_[static_cast<int>(fault)];
  if (pending.count <= 0) return absl::OkStatus();
  --pending.count;
  return pending.status;
}

void SimCudaRuntime::InjectFault(SimFault fault, int count,
                                 absl::Status status) {
  if (status.ok()) status = absl::InternalError("injected fault");
  MutexLock lock(&mu_);
  PendingFault& pending = faults_[static_cast<int>(fault)];
  if (count <= 0) {
    pending = PendingFault{};
    return;
  }
  pending.count += count;
  pending.status = std::move(status);
}

void SimCudaRuntime::SetWorkDelay(absl::Duration delay) {
  work_delay_ns_.store(absl::ToInt64Nanoseconds(delay));
}

absl::StatusOr<DeviceInfo> SimCudaRuntime::GetDeviceInfo(int device) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  DeviceInfo info;
  info.name = absl::StrCat("Simulated GPU ", device);
  info.pci_bus_id = absl::StrFormat("0000:%02x:00.0", device + 1);
  info.total_bytes = options_.device_total_bytes;
  {
    MutexLock lock(&mu_);
    info.free_bytes = options_.device_total_bytes - allocated_[device];
  }
  info.multiprocessors = options_.multiprocessors;
  info.compute_capability = 90;
  return info;
}

// --- Memory ranges -----------------------------------------------------------

std::map<uintptr_t, SimCudaRuntime::MemRange>::const_iterator
SimCudaRuntime::RangeOf(const void* ptr) const {
  const uintptr_t p = Address(ptr);
  auto it = memory_.upper_bound(p);
  if (it == memory_.begin()) return memory_.end();
  --it;
  if (p >= it->first + it->second.bytes) return memory_.end();
  return it;
}

absl::Status SimCudaRuntime::AddRange(void* ptr, MemRange range) {
  const uintptr_t begin = Address(ptr);
  const uintptr_t end = begin + (range.bytes > 0 ? range.bytes : 1);
  auto next = memory_.lower_bound(begin);
  const bool overlaps_next = next != memory_.end() && next->first < end;
  bool overlaps_prev = false;
  if (next != memory_.begin()) {
    auto prev = std::prev(next);
    overlaps_prev = prev->first + prev->second.bytes > begin;
  }
  if (overlaps_next || overlaps_prev) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "[%p, +%u) overlaps memory already known to the simulated runtime", ptr,
        range.bytes));
  }
  memory_.emplace(begin, std::move(range));
  return absl::OkStatus();
}

absl::StatusOr<SimCudaRuntime::Span> SimCudaRuntime::AccessibleSpan(
    const void* ptr, size_t bytes) {
  MutexLock lock(&mu_);
  auto it = RangeOf(ptr);
  if (it == memory_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%p is not device-accessible memory (a device allocation, an IPC "
        "mapping, registered or pinned host memory)",
        ptr));
  }
  Span span{it->first, it->first + it->second.bytes};
  // Adjacent ranges (e.g. a pool registered in pieces) count as one.
  for (auto prev = it; prev != memory_.begin();) {
    --prev;
    if (prev->first + prev->second.bytes != span.begin) break;
    span.begin = prev->first;
  }
  for (auto next = std::next(it);
       next != memory_.end() && next->first == span.end; ++next) {
    span.end = next->first + next->second.bytes;
  }
  if (Address(ptr) + bytes > span.end) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "[%p, +%u) runs past the end of device-accessible memory", ptr, bytes));
  }
  return span;
}

// --- Device memory -----------------------------------------------------------

absl::StatusOr<void*> SimCudaRuntime::DeviceMalloc(int device, size_t bytes) {
  if (absl::Status s = TakeFault(SimFault::kDeviceMalloc); !s.ok()) return s;
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (bytes == 0) return nullptr;  // Like cudaMalloc.
  {
    MutexLock lock(&mu_);
    const uint64_t total = options_.device_total_bytes;
    if (bytes > total || allocated_[device] > total - bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "simulated device ", device, ": cannot allocate ", bytes,
          " bytes: ", allocated_[device], " of ", total, " bytes in use"));
    }
    allocated_[device] += bytes;  // Reserved; given back on failure below.
  }
  auto unreserve = [&](absl::Status status) {
    MutexLock lock(&mu_);
    allocated_[device] -= bytes;
    return status;
  };
  const std::string name = NewSegmentName();
  const int fd =
      shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
  if (fd < 0)
    return unreserve(ErrnoError(errno, absl::StrCat("shm_open ", name)));
  // Like the daemon's ShmPool (daemon/pool/shm_pool.h): the simulated device
  // memory is mapped by workers through IPC handles, so it is 0660 with the
  // daemon's effective group, whatever the umask or the group of /dev/shm.
  {
    struct stat st {};
    int err = 0;
    if (fstat(fd, &st) != 0 ||
        (st.st_gid != getegid() &&
         fchown(fd, static_cast<uid_t>(-1), getegid()) != 0) ||
        fchmod(fd, 0660) != 0) {
      err = errno;
    }
    if (err != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return unreserve(
          ErrnoError(err, absl::StrCat("sharing ", name, " with the group")));
    }
  }
  // Sparse: pages take memory only once written.
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return unreserve(ErrnoError(err, absl::StrCat("ftruncate ", name)));
  }
  void* ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (ptr == MAP_FAILED) {
    shm_unlink(name.c_str());
    return unreserve(ErrnoError(err, absl::StrCat("mmap ", name)));
  }
  MemRange range{.kind = MemRange::Kind::kDevice,
                 .bytes = bytes,
                 .mapped_bytes = bytes,
                 .device = device,
                 .shm_name = name};
  MutexLock lock(&mu_);
  if (absl::Status s = AddRange(ptr, std::move(range)); !s.ok()) {
    allocated_[device] -= bytes;
    munmap(ptr, bytes);
    shm_unlink(name.c_str());
    return s;
  }
  return ptr;
}

absl::Status SimCudaRuntime::DeviceFree(int device, void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  MemRange range;
  {
    MutexLock lock(&mu_);
    auto it = memory_.find(Address(ptr));
    if (it == memory_.end() || it->second.kind != MemRange::Kind::kDevice) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "DeviceFree: %p is not a simulated device allocation", ptr));
    }
    if (it->second.device != device) {
      return absl::InvalidArgumentError(
          absl::StrFormat("DeviceFree: %p belongs to device %d, not %d", ptr,
                          it->second.device, device));
    }
    range = std::move(it->second);
    memory_.erase(it);
    allocated_[device] -= range.bytes;
  }
  munmap(ptr, range.mapped_bytes);
  shm_unlink(range.shm_name.c_str());
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::Memset(void* device_ptr, int value, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (device_ptr == nullptr) {
    return absl::InvalidArgumentError("Memset: null pointer");
  }
  std::memset(device_ptr, value, bytes);
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::CopyToDevice(void* device_dst,
                                          const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (device_dst == nullptr || host_src == nullptr) {
    return absl::InvalidArgumentError("CopyToDevice: null pointer");
  }
  std::memmove(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status SimCudaRuntime::CopyToHost(void* host_dst, const void* device_src,
                                        size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (host_dst == nullptr || device_src == nullptr) {
    return absl::InvalidArgumentError("CopyToHost: null pointer");
  }
  std::memmove(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::StatusOr<std::string> SimCudaRuntime::IpcGetMemHandle(void* device_ptr) {
  std::string name;
  {
    MutexLock lock(&mu_);
    auto it = RangeOf(device_ptr);
    if (it == memory_.end() || it->second.shm_name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "IpcGetMemHandle: %p is not in simulated device memory", device_ptr));
    }
    name = it->second.shm_name;
  }
  std::string handle(kIpcHandleBytes, '\0');
  std::memcpy(handle.data(), kMemMagic, sizeof(kMemMagic));
  std::memcpy(handle.data() + sizeof(kMemMagic), name.data(), name.size());
  return handle;
}

absl::StatusOr<void*> SimCudaRuntime::IpcOpenMemHandle(
    int device, const std::string& handle) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (handle.size() != kIpcHandleBytes ||
      std::memcmp(handle.data(), kMemMagic, sizeof(kMemMagic)) != 0 ||
      handle.back() != '\0') {
    return absl::InvalidArgumentError(
        "IpcOpenMemHandle: not a simulated IPC memory handle");
  }
  const std::string name(handle.c_str() + sizeof(kMemMagic));
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("shm_open ", name));
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    const int err = st.st_size <= 0 ? EINVAL : errno;
    close(fd);
    return ErrnoError(err, absl::StrCat("fstat ", name));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* ptr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (ptr == MAP_FAILED) return ErrnoError(err, absl::StrCat("mmap ", name));
  MemRange range{.kind = MemRange::Kind::kIpcMapped,
                 .bytes = bytes,
                 .mapped_bytes = bytes,
                 .device = device,
                 .shm_name = name};
  MutexLock lock(&mu_);
  if (absl::Status s = AddRange(ptr, std::move(range)); !s.ok()) {
    munmap(ptr, bytes);
    return s;
  }
  return ptr;
}

absl::Status SimCudaRuntime::IpcCloseMemHandle(void* device_ptr) {
  size_t bytes = 0;
  {
    MutexLock lock(&mu_);
    auto it = memory_.find(Address(device_ptr));
    if (it == memory_.end() || it->second.kind != MemRange::Kind::kIpcMapped) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "IpcCloseMemHandle: %p was not opened with IpcOpenMemHandle",
          device_ptr));
    }
    bytes = it->second.mapped_bytes;
    memory_.erase(it);
  }
  munmap(device_ptr, bytes);
  return absl::OkStatus();
}

// --- Host memory -------------------------------------------------------------

absl::Status SimCudaRuntime::HostRegister(void* ptr, size_t bytes) {
  if (absl::Status s = TakeFault(SimFault::kHostRegister); !s.ok()) return s;
  if (ptr == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        "HostRegister needs a non-null pointer and a positive size");
  }
  MutexLock lock(&mu_);
  return AddRange(ptr, MemRange{.kind = MemRange::Kind::kRegistered,
                                .bytes = bytes,
                                .mapped_bytes = bytes});
}

absl::Status SimCudaRuntime::HostUnregister(void* ptr) {
  MutexLock lock(&mu_);
  auto it = memory_.find(Address(ptr));
  if (it == memory_.end() || it->second.kind != MemRange::Kind::kRegistered) {
    return absl::NotFoundError(absl::StrFormat(
        "HostUnregister: %p is not the start of registered host memory", ptr));
  }
  memory_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<void*> SimCudaRuntime::HostAllocPinned(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPinnedAlignment - 1) /
                         kPinnedAlignment * kPinnedAlignment;
  void* ptr = std::aligned_alloc(kPinnedAlignment, rounded);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("HostAllocPinned: cannot allocate ", bytes, " bytes"));
  }
  MutexLock lock(&mu_);
  if (absl::Status s = AddRange(ptr, MemRange{.kind = MemRange::Kind::kPinned,
                                              .bytes = bytes,
                                              .mapped_bytes = rounded});
      !s.ok()) {
    std::free(ptr);
    return s;
  }
  return ptr;
}

absl::Status SimCudaRuntime::HostFreePinned(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  {
    MutexLock lock(&mu_);
    auto it = memory_.find(Address(ptr));
    if (it == memory_.end() || it->second.kind != MemRange::Kind::kPinned) {
      return absl::NotFoundError(absl::StrFormat(
          "HostFreePinned: %p was not allocated with HostAllocPinned", ptr));
    }
    memory_.erase(it);
  }
  std::free(ptr);
  return absl::OkStatus();
}

}  // namespace hicache::cuda
