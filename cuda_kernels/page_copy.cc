#include "hicache/cuda_kernels/page_copy.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "cuda_kernels/raw_api.h"

namespace hicache::cuda {
namespace {

absl::Status FromRaw(int code, absl::string_view what) {
  if (code == 0) return absl::OkStatus();
  if (code == raw::kNotCompiled) {
    return absl::UnavailableError(
        absl::StrCat(what, ": this build has no CUDA support"));
  }
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", code, " (",
                                          raw::RawErrorString(code), ")"));
}

}  // namespace

bool CompiledWithCuda() { return raw::CompiledWithCuda(); }

absl::StatusOr<int> VisibleDeviceCount() {
  int count = 0;
  if (absl::Status s = FromRaw(raw::RawDeviceCount(&count), "device count");
      !s.ok()) {
    return s;
  }
  return count;
}

absl::Status ValidatePageCopy(const PageCopy& copy) {
  if (copy.num_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_pages must be >= 0, got ", copy.num_pages));
  }
  if (copy.bytes_per_page <= 0 || copy.bytes_per_page % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_page must be a positive multiple of 4, got ",
                     copy.bytes_per_page));
  }
  for (const auto& [name, stride] :
       {std::pair{"src_stride_bytes", copy.src_stride_bytes},
        std::pair{"dst_stride_bytes", copy.dst_stride_bytes}}) {
    if (stride < copy.bytes_per_page || stride % 4 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be a multiple of 4 and >= bytes_per_page (",
                       copy.bytes_per_page, "), got ", stride));
    }
  }
  if (copy.num_pages == 0) return absl::OkStatus();
  if (copy.src == nullptr || copy.dst == nullptr || copy.src_pages == nullptr ||
      copy.dst_pages == nullptr) {
    return absl::InvalidArgumentError(
        "src, dst, src_pages and dst_pages must be non-null when num_pages > "
        "0");
  }
  if (reinterpret_cast<uintptr_t>(copy.src) % 4 != 0 ||
      reinterpret_cast<uintptr_t>(copy.dst) % 4 != 0) {
    return absl::InvalidArgumentError("src and dst must be 4-byte aligned");
  }
  return absl::OkStatus();
}

absl::Status LaunchPageCopy(const PageCopy& copy, void* stream) {
  if (absl::Status valid = ValidatePageCopy(copy); !valid.ok()) return valid;
  return FromRaw(raw::RawLaunchPageCopy(
                     copy.src, copy.dst, copy.src_pages, copy.dst_pages,
                     copy.num_pages, copy.bytes_per_page, copy.src_stride_bytes,
                     copy.dst_stride_bytes, stream),
                 "page copy launch");
}

absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  void* ptr = nullptr;
  if (absl::Status s = FromRaw(raw::RawMalloc(&ptr, bytes), "cudaMalloc");
      !s.ok()) {
    return s;
  }
  return ptr;
}

absl::Status DeviceFree(void* ptr) {
  return FromRaw(raw::RawFree(ptr), "cudaFree");
}

absl::Status CopyToDevice(void* device_dst, const void* host_src,
                          size_t bytes) {
  return FromRaw(raw::RawCopy(device_dst, host_src, bytes, true),
                 "copy to device");
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes) {
  return FromRaw(raw::RawCopy(host_dst, device_src, bytes, false),
                 "copy to host");
}

absl::Status SynchronizeStream(void* stream) {
  return FromRaw(raw::RawSynchronize(stream), "stream synchronize");
}

}  // namespace hicache::cuda
