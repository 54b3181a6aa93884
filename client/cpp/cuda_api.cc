#include "client/cpp/cuda_api.h"

#include <dlfcn.h>

#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hicache::client {
namespace {

// cudaError_t values (stable across CUDA releases) that the status mapping
// distinguishes.
constexpr int kInvalidValue = 1;
constexpr int kMemoryAllocation = 2;
constexpr int kInitializationError = 3;
constexpr int kInvalidDevicePointer = 17;
constexpr int kStubLibrary = 34;
constexpr int kInsufficientDriver = 35;
constexpr int kCallRequiresNewerDriver = 36;
constexpr int kDevicesUnavailable = 46;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
constexpr int kDeviceNotLicensed = 102;
constexpr int kMapBufferObjectFailed = 205;
constexpr int kPeerAccessUnsupported = 217;
constexpr int kInvalidResourceHandle = 400;
constexpr int kNotPermitted = 800;
constexpr int kNotSupported = 801;
constexpr int kSystemNotReady = 802;
constexpr int kSystemDriverMismatch = 803;
constexpr int kCompatNotSupportedOnDevice = 804;

// cudaIpcMemLazyEnablePeerAccess; cudaEventDisableTiming |
// cudaEventInterprocess.
constexpr unsigned kIpcMemLazyEnablePeerAccess = 0x01;
constexpr unsigned kEventDisableTimingInterprocess = 0x02 | 0x04;

bool IsUnusableGpu(int code) {
  switch (code) {
    case kInitializationError:
    case kStubLibrary:
    case kInsufficientDriver:
    case kCallRequiresNewerDriver:
    case kDevicesUnavailable:
    case kNoDevice:
    case kInvalidDevice:
    case kDeviceNotLicensed:
    case kMapBufferObjectFailed:
    case kPeerAccessUnsupported:
    case kNotPermitted:
    case kNotSupported:
    case kSystemNotReady:
    case kSystemDriverMismatch:
    case kCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

}  // namespace

// Every entry point, resolved by name with dlsym. cudaError_t is an int enum;
// the IPC handle types are 64-byte structs passed by value.
struct CudaApi::Symbols {
  int (*set_device)(int);
  int (*get_device)(int*);
  int (*device_get_by_pci_bus_id)(int*, const char*);
  int (*ipc_open_mem_handle)(void**, CudaIpcHandle, unsigned);
  int (*ipc_close_mem_handle)(void*);
  int (*ipc_open_event_handle)(CudaEvent*, CudaIpcHandle);
  int (*ipc_get_event_handle)(CudaIpcHandle*, CudaEvent);
  int (*event_create_with_flags)(CudaEvent*, unsigned);
  int (*event_record)(CudaEvent, CudaStream);
  int (*event_destroy)(CudaEvent);
  int (*stream_wait_event)(CudaStream, CudaEvent, unsigned);
  const char* (*get_error_string)(int);
};

absl::StatusOr<CudaIpcHandle> ToIpcHandle(absl::string_view bytes,
                                          absl::string_view what) {
  if (bytes.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", bytes.size(),
                     " bytes; a CUDA IPC handle is ", kCudaIpcHandleBytes));
  }
  CudaIpcHandle handle;
  std::memcpy(handle.bytes, bytes.data(), kCudaIpcHandleBytes);
  return handle;
}

std::vector<std::string> CudaApi::DefaultCandidates() {
  std::vector<std::string> candidates;
  for (const char* dir : {"", "/usr/local/cuda/lib64/"}) {
    for (const char* name :
         {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      candidates.push_back(absl::StrCat(dir, name));
    }
  }
  return candidates;
}

absl::StatusOr<const CudaApi*> CudaApi::Get() {
  // Never destroyed: the runtime stays loaded until the process exits.
  static const auto* const loaded =
      new absl::StatusOr<std::unique_ptr<CudaApi>>(Load(DefaultCandidates()));
  if (!loaded->ok()) return loaded->status();
  return loaded->value().get();
}

absl::StatusOr<std::unique_ptr<CudaApi>> CudaApi::Load(
    const std::vector<std::string>& candidates) {
  std::vector<std::string> failures;
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failures.push_back(why != nullptr ? why : path + ": dlopen failed");
      continue;
    }
    auto symbols = std::make_unique<Symbols>();
    std::string missing;
    auto resolve = [&](auto** slot, const char* name) {
      *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(
          dlsym(handle, name));
      if (*slot == nullptr && missing.empty()) missing = name;
    };
    resolve(&symbols->set_device, "cudaSetDevice");
    resolve(&symbols->get_device, "cudaGetDevice");
    resolve(&symbols->device_get_by_pci_bus_id, "cudaDeviceGetByPCIBusId");
    resolve(&symbols->ipc_open_mem_handle, "cudaIpcOpenMemHandle");
    resolve(&symbols->ipc_close_mem_handle, "cudaIpcCloseMemHandle");
    resolve(&symbols->ipc_open_event_handle, "cudaIpcOpenEventHandle");
    resolve(&symbols->ipc_get_event_handle, "cudaIpcGetEventHandle");
    resolve(&symbols->event_create_with_flags, "cudaEventCreateWithFlags");
    resolve(&symbols->event_record, "cudaEventRecord");
    resolve(&symbols->event_destroy, "cudaEventDestroy");
    resolve(&symbols->stream_wait_event, "cudaStreamWaitEvent");
    resolve(&symbols->get_error_string, "cudaGetErrorString");
    if (!missing.empty()) {
      failures.push_back(absl::StrCat(path, ": no symbol ", missing));
      dlclose(handle);
      continue;
    }
    return std::unique_ptr<CudaApi>(
        new CudaApi(handle, path, std::move(symbols)));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "libcudart could not be loaded: ", failures.empty()
                                             ? "no candidate library"
                                             : absl::StrJoin(failures, "; ")));
}

CudaApi::CudaApi(void* library, std::string path,
                 std::unique_ptr<Symbols> symbols)
    : handle_(library),
      library_(std::move(path)),
      symbols_(std::move(symbols)) {}

CudaApi::~CudaApi() { dlclose(handle_); }

absl::Status CudaApi::Error(int code, absl::string_view call) const {
  if (code == 0) return absl::OkStatus();
  const char* text = symbols_->get_error_string(code);
  const std::string message =
      absl::StrCat(call, ": ", text != nullptr ? text : "unknown error",
                   " (CUDA error ", code, ")");
  if (IsUnusableGpu(code)) return absl::FailedPreconditionError(message);
  switch (code) {
    case kMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case kInvalidValue:
    case kInvalidDevicePointer:
    case kInvalidResourceHandle:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<int> CudaApi::FindDevice(absl::string_view pci_bus_id,
                                        int fallback) const {
  if (!pci_bus_id.empty()) {
    const std::string id(pci_bus_id);
    int device = -1;
    const int code = symbols_->device_get_by_pci_bus_id(&device, id.c_str());
    if (code == 0) return device;
    // Not visible under this id (other numbering, masked): use the ordinal.
    // Anything else (no driver, no device) is final.
    if (code != kInvalidDevice && code != kInvalidValue) {
      return Error(code, absl::StrCat("cudaDeviceGetByPCIBusId(", id, ")"));
    }
  }
  if (fallback < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no usable device: PCI bus id '", pci_bus_id,
                     "' and ordinal ", fallback));
  }
  return fallback;
}

absl::Status CudaApi::OnDevice(int device,
                               absl::FunctionRef<absl::Status()> fn) const {
  int previous = -1;
  if (int code = symbols_->get_device(&previous); code != 0) {
    return Error(code, "cudaGetDevice");
  }
  if (int code = symbols_->set_device(device); code != 0) {
    return Error(code, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  absl::Status status = fn();
  if (previous != device) symbols_->set_device(previous);
  return status;
}

absl::StatusOr<void*> CudaApi::IpcOpenMemHandle(
    const CudaIpcHandle& handle) const {
  void* ptr = nullptr;
  if (int code = symbols_->ipc_open_mem_handle(&ptr, handle,
                                               kIpcMemLazyEnablePeerAccess);
      code != 0) {
    return Error(code, "cudaIpcOpenMemHandle");
  }
  return ptr;
}

absl::Status CudaApi::IpcCloseMemHandle(void* device_ptr) const {
  return Error(symbols_->ipc_close_mem_handle(device_ptr),
               "cudaIpcCloseMemHandle");
}

absl::StatusOr<CudaEvent> CudaApi::IpcOpenEventHandle(
    const CudaIpcHandle& handle) const {
  CudaEvent event = nullptr;
  if (int code = symbols_->ipc_open_event_handle(&event, handle); code != 0) {
    return Error(code, "cudaIpcOpenEventHandle");
  }
  return event;
}

absl::StatusOr<CudaEvent> CudaApi::CreateInterprocessEvent() const {
  CudaEvent event = nullptr;
  if (int code = symbols_->event_create_with_flags(
          &event, kEventDisableTimingInterprocess);
      code != 0) {
    return Error(code, "cudaEventCreateWithFlags");
  }
  return event;
}

absl::StatusOr<CudaIpcHandle> CudaApi::IpcGetEventHandle(
    CudaEvent event) const {
  CudaIpcHandle handle;
  if (int code = symbols_->ipc_get_event_handle(&handle, event); code != 0) {
    return Error(code, "cudaIpcGetEventHandle");
  }
  return handle;
}

absl::Status CudaApi::EventRecord(CudaEvent event, CudaStream stream) const {
  return Error(symbols_->event_record(event, stream), "cudaEventRecord");
}

absl::Status CudaApi::StreamWaitEvent(CudaStream stream,
                                      CudaEvent event) const {
  return Error(symbols_->stream_wait_event(stream, event, 0),
               "cudaStreamWaitEvent");
}

absl::Status CudaApi::EventDestroy(CudaEvent event) const {
  return Error(symbols_->event_destroy(event), "cudaEventDestroy");
}

}  // namespace hicache::client
