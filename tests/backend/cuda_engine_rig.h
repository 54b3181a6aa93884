#pragma once

// The fixture of the CudaTransferEngine tests: pools of ranks 1 and 3 of a
// CP group of 4 (devices 0 and 1) through CudaPoolBackend, an engine on a
// RecordingRuntime over the base runtime, a RecordingListener, and the
// reference model of a step's bytes.
//
// The base runtime is a SimCudaRuntime with two devices, or, with
// HICACHE_CUDA_RUNTIME=real, the GPU's RealCudaRuntime: there every test
// skips when no GPU is visible, devices past the last GPU wrap around (one
// GPU serves both ranks), and a test that needs the simulator (fault
// injection, counters) calls SkipUnlessSimulated() first.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/backend/cuda/cuda_pool_backend.h"
#include "daemon/backend/cuda/cuda_transfer_engine.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "gtest/gtest.h"
#include "tests/backend/cuda_test_support.h"
#include "tests/testing/cuda_runtime_mode.h"

namespace hicache::testing {

constexpr TransferDirection kD2H = TransferDirection::kDeviceToHost;
constexpr TransferDirection kH2D = TransferDirection::kHostToDevice;

struct RigConfig {
  std::string preset = "tiny-draft";
  HostLayout host_layout = HostLayout::kLayerFirst;
  int64_t device_pages = 4;
  int64_t host_pages = 6;
  // Ranks 1 and 3 of a CP group of 4, on sim devices 0 and 1.
  std::vector<int> device_of_rank = {-1, 0, -1, 1};
  int32_t max_blocks = 0;
};

class CudaEngineRig : public ::testing::Test {
 protected:
  void Build(RigConfig config = {}) {
    engine_.reset();
    pools_.reset();
    if (real_ != nullptr) {
      absl::StatusOr<int> gpus = real_->DeviceCount();
      if (!gpus.ok() || *gpus == 0) {
        GTEST_SKIP() << "HICACHE_CUDA_RUNTIME=real but no GPU is visible: "
                     << (gpus.ok() ? "0 CUDA devices" : gpus.status().ToString());
      }
      gpus_ = *gpus;
    }
    config.device_of_rank = OnDevices(config.device_of_rank);
    config_ = config;
    auto layout = CpLayout::Create(64, 4, {1, 3});
    ASSERT_TRUE(layout.ok()) << layout.status();
    auto geometry = KvGeometry::Preset(config.preset);
    ASSERT_TRUE(geometry.ok()) << geometry.status();
    // Pools on every rank of the map with a device (1 and 3).
    pool_backend_ = std::make_unique<CudaPoolBackend>(
        &runtime_, OnDevices({-1, 0, -1, 1}), testing::UniqueShmPrefix());
    auto pools = RankPools::Create(
        *layout, *geometry,
        RankPoolsOptions{.device_pages_per_rank = config.device_pages,
                         .host_pages_per_rank = config.host_pages,
                         .host_layout = config.host_layout},
        *pool_backend_);
    ASSERT_TRUE(pools.ok()) << pools.status();
    pools_ = *std::move(pools);
    auto engine = CudaTransferEngine::Create(
        &runtime_, pools_.get(), &listener_,
        CudaTransferEngineOptions{.device_of_rank = config.device_of_rank,
                                  .max_blocks_per_copy = config.max_blocks});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }

  void SetUp() override { Build(); }

  bool real() const { return real_ != nullptr; }
  // Skips the calling test on a real GPU: it needs the simulator.
  void SkipUnlessSimulated(const char* why) {
    if (real()) GTEST_SKIP() << "needs the simulated runtime: " << why;
  }
  // Makes the simulated copies slow (so that work queues up); a no-op on a
  // real GPU, whose tests hold however fast its copies are.
  void SlowDown(absl::Duration per_item) {
    if (!real()) sim_.SetWorkDelay(per_item);
  }
  // The runtime under the recorder (streams and events of the test's own).
  cuda::CudaRuntime& base() {
    return real_ != nullptr ? static_cast<cuda::CudaRuntime&>(*real_) : sim_;
  }
  // The device of a sim device ordinal on the base runtime (real GPUs wrap).
  int Device(int sim_device) const {
    return sim_device < 0 || real_ == nullptr ? sim_device
                                              : sim_device % gpus_;
  }
  std::vector<int> OnDevices(std::vector<int> devices) const {
    for (int& d : devices) d = Device(d);
    return devices;
  }
  void TearDown() override {
    sim_.SetWorkDelay(absl::ZeroDuration());
    engine_.reset();
  }

  const KvGeometry& geometry() const { return pools_->geometry(); }
  uint64_t DeviceBytes() const { return pools_->device(1)->size_bytes(); }

  // Fills rank's device pool with a pattern; returns it.
  std::vector<uint8_t> FillDevice(Rank rank, uint64_t seed) {
    std::vector<uint8_t> bytes = PatternBytes(DeviceBytes(), seed);
    EXPECT_TRUE(runtime_
                    .CopyToDevice(pools_->device(rank)->backend_data(),
                                  bytes.data(), bytes.size())
                    .ok());
    return bytes;
  }
  std::vector<uint8_t> DeviceImage(Rank rank) {
    std::vector<uint8_t> bytes(DeviceBytes());
    EXPECT_TRUE(runtime_
                    .CopyToHost(bytes.data(),
                                pools_->device(rank)->backend_data(),
                                bytes.size())
                    .ok());
    return bytes;
  }
  std::vector<uint8_t> HostImage(Rank rank) {
    const auto* data =
        static_cast<const uint8_t*>(pools_->host(rank)->host_data());
    return std::vector<uint8_t>(data, data + pools_->host(rank)->size_bytes());
  }

  // What the copy of `step` must do: the reference model, block by block.
  void Model(TransferDirection direction, uint32_t step, const RankCopy& copy,
             uint8_t* device, uint8_t* host) const {
    const RankPoolsOptions& o = pools_->options();
    for (const auto& [f, l] : geometry().StepBlocks(step)) {
      const uint64_t block = geometry().BlockBytes(f);
      for (size_t i = 0; i < copy.device_pages.size(); ++i) {
        uint8_t* d =
            device + geometry().DeviceOffset(o.device_pages_per_rank,
                                             copy.device_pages[i], f, l);
        uint8_t* h =
            host + geometry().HostOffset(o.host_layout, o.host_pages_per_rank,
                                         copy.host_pages[i], f, l);
        if (direction == kD2H) {
          std::memcpy(h, d, block);
        } else {
          std::memcpy(d, h, block);
        }
      }
    }
  }
  uint64_t StepBytes(uint32_t step, size_t pages) const {
    uint64_t bytes = 0;
    for (const auto& [f, l] : geometry().StepBlocks(step)) {
      bytes += geometry().BlockBytes(f);
    }
    return bytes * pages;
  }

  static RankCopy Copy(Rank rank, std::vector<int64_t> device,
                       std::vector<int64_t> host, uint64_t fence = 0) {
    return RankCopy{.rank = rank,
                    .device_pages = std::move(device),
                    .host_pages = std::move(host),
                    .wait_fence = fence};
  }

  cuda::SimCudaRuntime sim_{
      cuda::SimOptions{.devices = 2, .device_total_bytes = 1ull << 30}};
  std::unique_ptr<cuda::RealCudaRuntime> real_ =
      RealCudaRuntimeRequested() ? std::make_unique<cuda::RealCudaRuntime>()
                                 : nullptr;
  int gpus_ = 0;  // GPUs of real_.
  RecordingRuntime runtime_{&base()};
  RigConfig config_;
  std::unique_ptr<CudaPoolBackend> pool_backend_;
  std::unique_ptr<RankPools> pools_;
  RecordingListener listener_;
  std::unique_ptr<CudaTransferEngine> engine_;
};

}  // namespace hicache::testing
