#pragma once

// The few CUDA runtime calls a worker needs to use the daemon's CUDA pools
// and fences, loaded at run time: the client builds without CUDA headers and
// runs on machines without CUDA (every call then fails cleanly instead of the
// binary failing to start).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache::client {

// Opaque CUDA runtime handles, as the runtime passes them (pointers).
using CudaStream = void*;  // cudaStream_t
using CudaEvent = void*;   // cudaEvent_t

// cudaIpcMemHandle_t and cudaIpcEventHandle_t: 64 opaque bytes each, passed
// by value (the same ABI as the runtime's own `struct { char reserved[64]; }`).
inline constexpr size_t kCudaIpcHandleBytes = 64;
struct CudaIpcHandle {
  char bytes[kCudaIpcHandleBytes];
};

// INVALID_ARGUMENT (naming `what`) unless `bytes` is exactly 64 bytes long.
absl::StatusOr<CudaIpcHandle> ToIpcHandle(absl::string_view bytes,
                                          absl::string_view what);

// libcudart, opened with dlopen. Immutable after loading; thread-safe (the
// CUDA runtime itself is). Calls that name a device act on the calling
// thread's current device unless they say otherwise.
class CudaApi {
 public:
  // The libraries Get() tries, in order: the loader's search path first
  // (libcudart.so, .so.13, .so.12), then /usr/local/cuda/lib64.
  static std::vector<std::string> DefaultCandidates();

  // The process-wide runtime, loaded on the first call from
  // DefaultCandidates() and kept for the life of the process (never
  // unloaded). FAILED_PRECONDITION "libcudart could not be loaded: <why each
  // candidate failed>" when none loads or one lacks a needed symbol.
  static absl::StatusOr<const CudaApi*> Get();

  // Loads the first of `candidates` that opens and has every symbol (tests;
  // tools that bundle their own runtime). Same errors as Get().
  static absl::StatusOr<std::unique_ptr<CudaApi>> Load(
      const std::vector<std::string>& candidates);

  ~CudaApi();
  CudaApi(const CudaApi&) = delete;
  CudaApi& operator=(const CudaApi&) = delete;

  // The path (as given to dlopen) of the library in use.
  const std::string& library() const { return library_; }

  // A failed call as a status: "<call>: <cudaGetErrorString> (CUDA error N)".
  // FAILED_PRECONDITION where the error means this process cannot use the
  // GPU (no device or driver, driver too old, device unavailable, IPC
  // mapping refused), RESOURCE_EXHAUSTED for out of memory,
  // INVALID_ARGUMENT for an invalid value, handle or pointer, INTERNAL
  // otherwise. OK for code 0.
  absl::Status Error(int code, absl::string_view call) const;

  // The device ordinal, in this process's numbering, of the GPU with PCI bus
  // id `pci_bus_id` ("0000:19:00.0"). Where the id is empty or names no
  // visible GPU, `fallback` (the daemon's ordinal) is used; a failure that
  // means no GPU is usable at all is returned as such.
  absl::StatusOr<int> FindDevice(absl::string_view pci_bus_id,
                                 int fallback) const;

  // Runs `fn` with `device` current on this thread, then restores the
  // previous current device. Errors of `fn` are returned as is.
  absl::Status OnDevice(int device, absl::FunctionRef<absl::Status()> fn) const;

  // cudaIpcOpenMemHandle with cudaIpcMemLazyEnablePeerAccess, on the current
  // device.
  absl::StatusOr<void*> IpcOpenMemHandle(const CudaIpcHandle& handle) const;
  absl::Status IpcCloseMemHandle(void* device_ptr) const;
  // cudaIpcOpenEventHandle on the current device.
  absl::StatusOr<CudaEvent> IpcOpenEventHandle(
      const CudaIpcHandle& handle) const;
  // cudaEventCreateWithFlags(cudaEventDisableTiming | cudaEventInterprocess)
  // on the current device.
  absl::StatusOr<CudaEvent> CreateInterprocessEvent() const;
  absl::StatusOr<CudaIpcHandle> IpcGetEventHandle(CudaEvent event) const;
  absl::Status EventRecord(CudaEvent event, CudaStream stream) const;
  // Orders all later work of `stream` after the event's latest record.
  absl::Status StreamWaitEvent(CudaStream stream, CudaEvent event) const;
  absl::Status EventDestroy(CudaEvent event) const;

 private:
  struct Symbols;
  CudaApi(void* library, std::string path, std::unique_ptr<Symbols> symbols);

  void* const handle_;  // dlopen handle.
  const std::string library_;
  const std::unique_ptr<const Symbols> symbols_;
};

}  // namespace hicache::client
