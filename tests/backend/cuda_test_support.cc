#include "tests/backend/cuda_test_support.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace hicache::testing {

std::string UniqueShmPrefix() {
  static std::atomic<int> next{0};
  return absl::StrCat("/hicache-cudatest-", getpid(), "-", next++);
}

std::vector<uint8_t> PatternBytes(size_t bytes, uint64_t seed) {
  std::vector<uint8_t> out(bytes);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes; i += 8) {
    // splitmix64
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<size_t>(8, bytes - i));
  }
  return out;
}

void RecordingListener::OnStepDone(StepDone done) {
  if (hook_) hook_(done);
  MutexLock lock(&mu_);
  dones_.push_back(std::move(done));
}

std::vector<StepDone> RecordingListener::dones() const {
  MutexLock lock(&mu_);
  return dones_;
}

size_t RecordingListener::count() const {
  MutexLock lock(&mu_);
  return dones_.size();
}

void RecordingListener::Clear() {
  MutexLock lock(&mu_);
  dones_.clear();
}

std::vector<RecordingRuntime::Launch> RecordingRuntime::launches() const {
  MutexLock lock(&mu_);
  return launches_;
}

absl::Status RecordingRuntime::LaunchPageCopy(const cuda::BatchedPageCopy& copy,
                                              cuda::Stream stream) {
  Launch launch{.copy = copy};
  if (copy.descriptors != nullptr) {
    const char* in = static_cast<const char*>(copy.descriptors);
    launch.regions.resize(copy.num_regions);
    launch.src_pages.resize(copy.num_pages);
    launch.dst_pages.resize(copy.num_pages);
    const size_t region_bytes = sizeof(cuda::CopyRegion) * copy.num_regions;
    const size_t list_bytes = sizeof(int64_t) * copy.num_pages;
    if (region_bytes > 0) {
      std::memcpy(launch.regions.data(), in, region_bytes);
    }
    if (list_bytes > 0) {
      std::memcpy(launch.src_pages.data(), in + region_bytes, list_bytes);
      std::memcpy(launch.dst_pages.data(), in + region_bytes + list_bytes,
                  list_bytes);
    }
  }
  {
    MutexLock lock(&mu_);
    launches_.push_back(std::move(launch));
  }
  return base_->LaunchPageCopy(copy, stream);
}

}  // namespace hicache::testing
