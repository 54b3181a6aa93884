#include "daemon/backend/cuda/real_cuda_runtime.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cuda_kernels/raw_api.h"

namespace hicache::cuda {
namespace {

static_assert(raw::kRawIpcHandleBytes == kIpcHandleBytes);
static_assert(sizeof(CopyRegion) == 40, "the kernel reads 40-byte regions");

// What Stream and Event point to.
struct RealStream {
  void* handle = nullptr;  // cudaStream_t
  int device = 0;
};
struct RealEvent {
  void* handle = nullptr;  // cudaEvent_t
  int device = 0;
  EventOptions options;
};

RealStream* AsReal(Stream stream) {
  return reinterpret_cast<RealStream*>(stream);
}
RealEvent* AsReal(Event event) { return reinterpret_cast<RealEvent*>(event); }

// `what` names the call (and its arguments where they help).
absl::Status FromRaw(int code, absl::string_view what) {
  if (code == 0) return absl::OkStatus();
  if (code == raw::kNotCompiled) {
    return absl::UnavailableError("this hicached was built without CUDA");
  }
  const std::string message = absl::StrCat(
      what, ": ", raw::RawErrorString(code), " (CUDA error ", code, ")");
  switch (raw::RawClassifyError(code)) {
    case raw::kRawOutOfMemory:
      return absl::ResourceExhaustedError(message);
    case raw::kRawAlreadyRegistered:
      return absl::AlreadyExistsError(message);
    case raw::kRawNotRegistered:
      return absl::NotFoundError(message);
    case raw::kRawNotReady:
      return absl::FailedPreconditionError(message);
    case raw::kRawNotSupported:
      return absl::UnimplementedError(message);
    case raw::kRawOtherError:
      break;
  }
  return absl::InternalError(message);
}

absl::Status SetDevice(int device) {
  return FromRaw(raw::RawSetDevice(device),
                 absl::StrCat("cudaSetDevice(", device, ")"));
}

// Selects the device owning `ptr` (none for host memory).
absl::Status SetDeviceOf(const void* ptr) {
  int device = -1;
  if (absl::Status s = FromRaw(raw::RawPointerDevice(ptr, &device),
                               "cudaPointerGetAttributes");
      !s.ok()) {
    return s;
  }
  return device >= 0 ? SetDevice(device) : absl::OkStatus();
}

absl::Status CheckStream(Stream stream, absl::string_view call) {
  if (stream == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": null stream"));
  }
  return absl::OkStatus();
}

absl::Status CheckEvent(Event event, absl::string_view call) {
  if (event == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": null event"));
  }
  return absl::OkStatus();
}

absl::Status CheckHandle(const std::string& handle, absl::string_view call) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": an IPC handle has ", kIpcHandleBytes,
                     " bytes, got ", handle.size()));
  }
  return absl::OkStatus();
}

}  // namespace

bool RealCudaRuntime::CompiledWithCuda() { return raw::CompiledWithCuda(); }

absl::StatusOr<int> RealCudaRuntime::DeviceCount() {
  if (!raw::CompiledWithCuda()) {
    return absl::UnavailableError("this hicached was built without CUDA");
  }
  int count = 0;
  if (absl::Status s =
          FromRaw(raw::RawDeviceCount(&count), "cudaGetDeviceCount");
      !s.ok()) {
    return s;
  }
  return count;
}

absl::StatusOr<DeviceInfo> RealCudaRuntime::GetDeviceInfo(int device) {
  raw::RawDeviceProps props{};
  if (absl::Status s =
          FromRaw(raw::RawGetDeviceProps(device, &props),
                  absl::StrCat("cudaGetDeviceProperties(", device, ")"));
      !s.ok()) {
    return s;
  }
  DeviceInfo info;
  info.name = props.name;
  info.pci_bus_id = props.pci_bus_id;
  info.total_bytes = props.total_bytes;
  info.free_bytes = props.free_bytes;
  info.multiprocessors = props.multiprocessors;
  info.compute_capability = props.major * 10 + props.minor;
  return info;
}

// --- Memory ------------------------------------------------------------------

absl::StatusOr<void*> RealCudaRuntime::DeviceMalloc(int device, size_t bytes) {
  void* ptr = nullptr;
  if (absl::Status s = FromRaw(
          raw::RawMallocOnDevice(device, &ptr, bytes),
          absl::StrCat("cudaMalloc(", bytes, " bytes on device ", device, ")"));
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::Status RealCudaRuntime::DeviceFree(int device, void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  if (absl::Status s = SetDevice(device); !s.ok()) return s;
  return FromRaw(raw::RawFree(ptr),
                 absl::StrFormat("cudaFree(%p on device %d)", ptr, device));
}

absl::Status RealCudaRuntime::Memset(void* device_ptr, int value,
                                     size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = SetDeviceOf(device_ptr); !s.ok()) return s;
  return FromRaw(raw::RawMemset(device_ptr, value, bytes),
                 absl::StrCat("cudaMemset(", bytes, " bytes)"));
}

absl::Status RealCudaRuntime::CopyToDevice(void* device_dst,
                                           const void* host_src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = SetDeviceOf(device_dst); !s.ok()) return s;
  return FromRaw(raw::RawMemcpy(device_dst, host_src, bytes),
                 absl::StrCat("cudaMemcpy(", bytes, " bytes to the device)"));
}

absl::Status RealCudaRuntime::CopyToHost(void* host_dst, const void* device_src,
                                         size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = SetDeviceOf(device_src); !s.ok()) return s;
  return FromRaw(raw::RawMemcpy(host_dst, device_src, bytes),
                 absl::StrCat("cudaMemcpy(", bytes, " bytes to the host)"));
}

absl::StatusOr<std::string> RealCudaRuntime::IpcGetMemHandle(void* device_ptr) {
  if (absl::Status s = SetDeviceOf(device_ptr); !s.ok()) return s;
  std::string handle(kIpcHandleBytes, '\0');
  if (absl::Status s =
          FromRaw(raw::RawIpcGetMemHandle(handle.data(), device_ptr),
                  "cudaIpcGetMemHandle");
      !s.ok()) {
    return s;
  }
  return handle;
}

absl::StatusOr<void*> RealCudaRuntime::IpcOpenMemHandle(
    int device, const std::string& handle) {
  if (absl::Status s = CheckHandle(handle, "IpcOpenMemHandle"); !s.ok()) {
    return s;
  }
  void* ptr = nullptr;
  if (absl::Status s =
          FromRaw(raw::RawIpcOpenMemHandle(device, handle.data(), &ptr),
                  absl::StrCat("cudaIpcOpenMemHandle(device ", device, ")"));
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::Status RealCudaRuntime::IpcCloseMemHandle(void* device_ptr) {
  if (absl::Status s = SetDeviceOf(device_ptr); !s.ok()) return s;
  return FromRaw(raw::RawIpcCloseMemHandle(device_ptr),
                 "cudaIpcCloseMemHandle");
}

absl::Status RealCudaRuntime::HostRegister(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return absl::InvalidArgumentError(
        "HostRegister needs a non-null pointer and a positive size");
  }
  return FromRaw(raw::RawHostRegister(ptr, bytes),
                 absl::StrFormat("cudaHostRegister(%p, %u bytes)", ptr, bytes));
}

absl::Status RealCudaRuntime::HostUnregister(void* ptr) {
  return FromRaw(raw::RawHostUnregister(ptr),
                 absl::StrFormat("cudaHostUnregister(%p)", ptr));
}

absl::StatusOr<void*> RealCudaRuntime::HostAllocPinned(size_t bytes) {
  void* ptr = nullptr;
  if (absl::Status s =
          FromRaw(raw::RawHostAlloc(&ptr, bytes),
                  absl::StrCat("cudaHostAlloc(", bytes, " bytes)"));
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::Status RealCudaRuntime::HostFreePinned(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  return FromRaw(raw::RawFreeHost(ptr),
                 absl::StrFormat("cudaFreeHost(%p)", ptr));
}

// --- Streams and events ------------------------------------------------------

absl::StatusOr<Stream> RealCudaRuntime::CreateStream(int device) {
  void* handle = nullptr;
  if (absl::Status s = FromRaw(
          raw::RawStreamCreate(device, &handle),
          absl::StrCat("cudaStreamCreateWithFlags(device ", device, ")"));
      !s.ok()) {
    return s;
  }
  return reinterpret_cast<Stream>(new RealStream{handle, device});
}

absl::Status RealCudaRuntime::DestroyStream(Stream stream) {
  if (absl::Status s = CheckStream(stream, "DestroyStream"); !s.ok()) return s;
  RealStream* real = AsReal(stream);
  if (absl::Status s = SetDevice(real->device); !s.ok()) return s;
  absl::Status status =
      FromRaw(raw::RawStreamDestroy(real->handle), "cudaStreamDestroy");
  delete real;
  return status;
}

absl::Status RealCudaRuntime::SynchronizeStream(Stream stream) {
  if (absl::Status s = CheckStream(stream, "SynchronizeStream"); !s.ok()) {
    return s;
  }
  RealStream* real = AsReal(stream);
  if (absl::Status s = SetDevice(real->device); !s.ok()) return s;
  return FromRaw(raw::RawSynchronize(real->handle), "cudaStreamSynchronize");
}

absl::StatusOr<Event> RealCudaRuntime::CreateEvent(int device,
                                                   EventOptions options) {
  if (options.interprocess && options.timing) {
    return absl::InvalidArgumentError(
        "an interprocess event cannot be a timing event");
  }
  void* handle = nullptr;
  if (absl::Status s = FromRaw(
          raw::RawEventCreate(device, options.timing, options.interprocess,
                              &handle),
          absl::StrCat("cudaEventCreateWithFlags(device ", device, ")"));
      !s.ok()) {
    return s;
  }
  return reinterpret_cast<Event>(new RealEvent{handle, device, options});
}

absl::Status RealCudaRuntime::DestroyEvent(Event event) {
  if (absl::Status s = CheckEvent(event, "DestroyEvent"); !s.ok()) return s;
  RealEvent* real = AsReal(event);
  if (absl::Status s = SetDevice(real->device); !s.ok()) return s;
  absl::Status status =
      FromRaw(raw::RawEventDestroy(real->handle), "cudaEventDestroy");
  delete real;
  return status;
}

absl::Status RealCudaRuntime::RecordEvent(Event event, Stream stream) {
  if (absl::Status s = CheckEvent(event, "RecordEvent"); !s.ok()) return s;
  if (absl::Status s = CheckStream(stream, "RecordEvent"); !s.ok()) return s;
  RealEvent* e = AsReal(event);
  RealStream* s = AsReal(stream);
  if (e->device != s->device) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordEvent: the event is on device ", e->device,
                     ", the stream on device ", s->device));
  }
  if (absl::Status status = SetDevice(s->device); !status.ok()) return status;
  return FromRaw(raw::RawEventRecord(e->handle, s->handle), "cudaEventRecord");
}

absl::Status RealCudaRuntime::StreamWaitEvent(Stream stream, Event event) {
  if (absl::Status s = CheckEvent(event, "StreamWaitEvent"); !s.ok()) return s;
  if (absl::Status s = CheckStream(stream, "StreamWaitEvent"); !s.ok()) {
    return s;
  }
  RealStream* s = AsReal(stream);
  if (absl::Status status = SetDevice(s->device); !status.ok()) return status;
  return FromRaw(raw::RawStreamWaitEvent(s->handle, AsReal(event)->handle),
                 "cudaStreamWaitEvent");
}

absl::Status RealCudaRuntime::SynchronizeEvent(Event event) {
  if (absl::Status s = CheckEvent(event, "SynchronizeEvent"); !s.ok()) {
    return s;
  }
  RealEvent* e = AsReal(event);
  if (absl::Status s = SetDevice(e->device); !s.ok()) return s;
  return FromRaw(raw::RawEventSynchronize(e->handle), "cudaEventSynchronize");
}

absl::StatusOr<bool> RealCudaRuntime::QueryEvent(Event event) {
  if (absl::Status s = CheckEvent(event, "QueryEvent"); !s.ok()) return s;
  RealEvent* e = AsReal(event);
  if (absl::Status s = SetDevice(e->device); !s.ok()) return s;
  bool complete = false;
  if (absl::Status s =
          FromRaw(raw::RawEventQuery(e->handle, &complete), "cudaEventQuery");
      !s.ok()) {
    return s;
  }
  return complete;
}

absl::StatusOr<float> RealCudaRuntime::ElapsedMs(Event start, Event end) {
  if (absl::Status s = CheckEvent(start, "ElapsedMs"); !s.ok()) return s;
  if (absl::Status s = CheckEvent(end, "ElapsedMs"); !s.ok()) return s;
  if (!AsReal(start)->options.timing || !AsReal(end)->options.timing) {
    return absl::InvalidArgumentError(
        "ElapsedMs: both events must be created with timing");
  }
  if (absl::Status s = SetDevice(AsReal(start)->device); !s.ok()) return s;
  float ms = 0;
  if (absl::Status s = FromRaw(raw::RawEventElapsedMs(AsReal(start)->handle,
                                                      AsReal(end)->handle, &ms),
                               "cudaEventElapsedTime");
      !s.ok()) {
    return s;
  }
  return ms;
}

absl::StatusOr<std::string> RealCudaRuntime::IpcGetEventHandle(Event event) {
  if (absl::Status s = CheckEvent(event, "IpcGetEventHandle"); !s.ok()) {
    return s;
  }
  RealEvent* e = AsReal(event);
  if (!e->options.interprocess) {
    return absl::InvalidArgumentError(
        "IpcGetEventHandle: the event was not created interprocess");
  }
  if (absl::Status s = SetDevice(e->device); !s.ok()) return s;
  std::string handle(kIpcHandleBytes, '\0');
  if (absl::Status s =
          FromRaw(raw::RawIpcGetEventHandle(handle.data(), e->handle),
                  "cudaIpcGetEventHandle");
      !s.ok()) {
    return s;
  }
  return handle;
}

absl::StatusOr<Event> RealCudaRuntime::IpcOpenEventHandle(
    int device, const std::string& handle) {
  if (absl::Status s = CheckHandle(handle, "IpcOpenEventHandle"); !s.ok()) {
    return s;
  }
  void* opened = nullptr;
  if (absl::Status s =
          FromRaw(raw::RawIpcOpenEventHandle(device, handle.data(), &opened),
                  absl::StrCat("cudaIpcOpenEventHandle(device ", device, ")"));
      !s.ok()) {
    return s;
  }
  return reinterpret_cast<Event>(
      new RealEvent{opened, device, EventOptions{.interprocess = true}});
}

// --- Work --------------------------------------------------------------------

absl::Status RealCudaRuntime::MemcpyAsync(void* dst, const void* src,
                                          size_t bytes, Stream stream) {
  if (absl::Status s = CheckStream(stream, "MemcpyAsync"); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  RealStream* s = AsReal(stream);
  if (absl::Status status = SetDevice(s->device); !status.ok()) return status;
  return FromRaw(raw::RawMemcpyAsync(dst, src, bytes, s->handle),
                 absl::StrCat("cudaMemcpyAsync(", bytes, " bytes)"));
}

absl::Status RealCudaRuntime::MemcpyBatchAsync(void* const* dsts,
                                               const void* const* srcs,
                                               const size_t* sizes,
                                               size_t count, Stream stream) {
  if (absl::Status s = CheckStream(stream, "MemcpyBatchAsync"); !s.ok()) {
    return s;
  }
  if (count == 0) return absl::OkStatus();
  if (dsts == nullptr || srcs == nullptr || sizes == nullptr) {
    return absl::InvalidArgumentError("MemcpyBatchAsync: null array");
  }
  RealStream* s = AsReal(stream);
  if (absl::Status status = SetDevice(s->device); !status.ok()) return status;
  return FromRaw(raw::RawMemcpyBatchAsync(dsts, srcs, sizes, count, s->handle),
                 absl::StrCat("cudaMemcpyBatchAsync(", count, " copies)"));
}

absl::Status RealCudaRuntime::LaunchPageCopy(const BatchedPageCopy& copy,
                                             Stream stream) {
  if (absl::Status s = CheckStream(stream, "LaunchPageCopy"); !s.ok()) return s;
  if (copy.num_regions < 0 || copy.num_pages < 0 || copy.max_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LaunchPageCopy: negative count (num_regions ", copy.num_regions,
        ", num_pages ", copy.num_pages, ", max_blocks ", copy.max_blocks, ")"));
  }
  if (copy.num_regions == 0 || copy.num_pages == 0) return absl::OkStatus();
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
  // The host's view of the regions: pinned or registered host memory is
  // read in place; device memory is copied back first (synchronously, so
  // regions in device memory must be in place before the call, not just
  // before the launch runs).
  int descriptor_device = -1;
  if (absl::Status s =
          FromRaw(raw::RawPointerDevice(copy.descriptors, &descriptor_device),
                  "cudaPointerGetAttributes(descriptors)");
      !s.ok()) {
    return s;
  }
  const auto* regions = static_cast<const CopyRegion*>(copy.descriptors);
  std::vector<CopyRegion> copied;
  if (descriptor_device >= 0) {
    copied.resize(copy.num_regions);
    if (absl::Status s = SetDevice(descriptor_device); !s.ok()) return s;
    if (absl::Status s =
            FromRaw(raw::RawMemcpy(copied.data(), copy.descriptors,
                                   copied.size() * sizeof(CopyRegion)),
                    "cudaMemcpy(copy regions to the host)");
        !s.ok()) {
      return s;
    }
    regions = copied.data();
  }
  if (absl::Status valid =
          ValidateRegions(regions, copy.num_regions, copy.num_pages);
      !valid.ok()) {
    return valid;
  }
  RealStream* s = AsReal(stream);
  if (absl::Status status = SetDevice(s->device); !status.ok()) return status;
  return FromRaw(
      raw::RawLaunchBatchedPageCopy(copy.src_base, copy.dst_base,
                                    copy.descriptors, copy.num_regions,
                                    copy.num_pages, copy.max_blocks, s->handle),
      absl::StrCat("batched page copy launch (", copy.num_regions,
                   " regions x ", copy.num_pages, " pages)"));
}

}  // namespace hicache::cuda
