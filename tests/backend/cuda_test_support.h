#pragma once

// Helpers for the CUDA backend tests (all on SimCudaRuntime): a listener that
// records completions, a runtime wrapper that records launches, byte
// patterns and unique shared-memory prefixes.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "daemon/backend/cuda/cuda_runtime.h"
#include "daemon/core/mutex.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::testing {

// A shared-memory prefix no other test (or process) uses.
std::string UniqueShmPrefix();

// Deterministic pseudo-random bytes.
std::vector<uint8_t> PatternBytes(size_t bytes, uint64_t seed);

// Records every StepDone; optionally runs a hook (outside its lock) first.
class RecordingListener final : public TransferListener {
 public:
  void OnStepDone(StepDone done) override ABSL_LOCKS_EXCLUDED(mu_);
  // Set before the engine runs.
  void set_hook(std::function<void(const StepDone&)> hook) {
    hook_ = std::move(hook);
  }
  std::vector<StepDone> dones() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t count() const ABSL_LOCKS_EXCLUDED(mu_);
  void Clear() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::function<void(const StepDone&)> hook_;
  mutable Mutex mu_;
  std::vector<StepDone> dones_ ABSL_GUARDED_BY(mu_);
};

// Forwards to `base` and records every LaunchPageCopy call (the copy and the
// descriptor bytes at call time), accepted or not.
class RecordingRuntime final : public cuda::CudaRuntime {
 public:
  struct Launch {
    cuda::BatchedPageCopy copy;
    std::vector<cuda::CopyRegion> regions;
    std::vector<int64_t> src_pages;
    std::vector<int64_t> dst_pages;
  };
  explicit RecordingRuntime(cuda::CudaRuntime* base) : base_(base) {}

  std::vector<Launch> launches() const ABSL_LOCKS_EXCLUDED(mu_);

  std::string name() const override { return base_->name(); }
  absl::StatusOr<int> DeviceCount() override { return base_->DeviceCount(); }
  absl::StatusOr<cuda::DeviceInfo> GetDeviceInfo(int device) override {
    return base_->GetDeviceInfo(device);
  }
  absl::StatusOr<void*> DeviceMalloc(int device, size_t bytes) override {
    return base_->DeviceMalloc(device, bytes);
  }
  absl::Status DeviceFree(int device, void* ptr) override {
    return base_->DeviceFree(device, ptr);
  }
  absl::Status Memset(void* ptr, int value, size_t bytes) override {
    return base_->Memset(ptr, value, bytes);
  }
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes) override {
    return base_->CopyToDevice(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes) override {
    return base_->CopyToHost(dst, src, bytes);
  }
  absl::StatusOr<std::string> IpcGetMemHandle(void* ptr) override {
    return base_->IpcGetMemHandle(ptr);
  }
  absl::StatusOr<void*> IpcOpenMemHandle(int device,
                                         const std::string& handle) override {
    return base_->IpcOpenMemHandle(device, handle);
  }
  absl::Status IpcCloseMemHandle(void* ptr) override {
    return base_->IpcCloseMemHandle(ptr);
  }
  absl::Status HostRegister(void* ptr, size_t bytes) override {
    return base_->HostRegister(ptr, bytes);
  }
  absl::Status HostUnregister(void* ptr) override {
    return base_->HostUnregister(ptr);
  }
  absl::StatusOr<void*> HostAllocPinned(size_t bytes) override {
    return base_->HostAllocPinned(bytes);
  }
  absl::Status HostFreePinned(void* ptr) override {
    return base_->HostFreePinned(ptr);
  }
  absl::StatusOr<cuda::Stream> CreateStream(int device) override {
    return base_->CreateStream(device);
  }
  absl::Status DestroyStream(cuda::Stream stream) override {
    return base_->DestroyStream(stream);
  }
  absl::Status SynchronizeStream(cuda::Stream stream) override {
    return base_->SynchronizeStream(stream);
  }
  absl::StatusOr<cuda::Event> CreateEvent(int device,
                                          cuda::EventOptions options) override {
    return base_->CreateEvent(device, options);
  }
  absl::Status DestroyEvent(cuda::Event event) override {
    return base_->DestroyEvent(event);
  }
  absl::Status RecordEvent(cuda::Event event, cuda::Stream stream) override {
    return base_->RecordEvent(event, stream);
  }
  absl::Status StreamWaitEvent(cuda::Stream stream,
                               cuda::Event event) override {
    return base_->StreamWaitEvent(stream, event);
  }
  absl::Status SynchronizeEvent(cuda::Event event) override {
    return base_->SynchronizeEvent(event);
  }
  absl::StatusOr<bool> QueryEvent(cuda::Event event) override {
    return base_->QueryEvent(event);
  }
  absl::StatusOr<float> ElapsedMs(cuda::Event start, cuda::Event end) override {
    return base_->ElapsedMs(start, end);
  }
  absl::StatusOr<std::string> IpcGetEventHandle(cuda::Event event) override {
    return base_->IpcGetEventHandle(event);
  }
  absl::StatusOr<cuda::Event> IpcOpenEventHandle(
      int device, const std::string& handle) override {
    return base_->IpcOpenEventHandle(device, handle);
  }
  absl::Status MemcpyAsync(void* dst, const void* src, size_t bytes,
                           cuda::Stream stream) override {
    return base_->MemcpyAsync(dst, src, bytes, stream);
  }
  absl::Status LaunchPageCopy(const cuda::BatchedPageCopy& copy,
                              cuda::Stream stream) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  cuda::CudaRuntime* const base_;
  mutable Mutex mu_;
  std::vector<Launch> launches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hicache::testing
