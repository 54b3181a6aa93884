// CudaPoolBackend and CudaBackend (creation, capacity) on SimCudaRuntime.

#include "daemon/backend/cuda/cuda_pool_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backend/cuda/cuda_backend.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/backend/cuda_test_support.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using testing::PatternBytes;
using testing::UniqueShmPrefix;

bool ShmExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

class CudaPoolBackendTest : public ::testing::Test {
 protected:
  cuda::SimCudaRuntime runtime_{
      cuda::SimOptions{.devices = 2, .device_total_bytes = 64 << 20}};
  std::string prefix_ = UniqueShmPrefix();
  // Ranks 1 and 3 of a CP group of 4, on devices 0 and 1.
  CudaPoolBackend backend_{&runtime_, {-1, 0, -1, 1}, prefix_};
};

TEST_F(CudaPoolBackendTest, DevicePoolIsZeroedDeviceMemoryExportedByIpc) {
  const uint64_t size = 1 << 20;
  absl::StatusOr<uint64_t> free_before =
      runtime_.GetDeviceInfo(1).value().free_bytes;
  auto pool = backend_.CreateDevicePool(3, size);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->size_bytes(), size);
  EXPECT_EQ((*pool)->host_data(), nullptr);
  ASSERT_NE((*pool)->backend_data(), nullptr);
  EXPECT_EQ((*pool)->name(), prefix_ + "-device-r3");
  EXPECT_FALSE((*pool)->pinned());
  EXPECT_EQ(runtime_.GetDeviceInfo(1).value().free_bytes, *free_before - size);
  EXPECT_EQ(runtime_.GetDeviceInfo(0).value().free_bytes, 64u << 20);

  const PoolExport e = (*pool)->Export();
  EXPECT_EQ(e.kind, PoolExport::Kind::kCudaIpc);
  EXPECT_EQ(e.handle.size(), cuda::kIpcHandleBytes);
  EXPECT_EQ(e.size_bytes, size);
  EXPECT_EQ(e.device, 1);
  EXPECT_EQ(e.pci_bus_id, runtime_.GetDeviceInfo(1).value().pci_bus_id);
  EXPECT_FALSE(e.pci_bus_id.empty());

  std::vector<uint8_t> bytes(size, 0xff);
  ASSERT_TRUE(
      runtime_.CopyToHost(bytes.data(), (*pool)->backend_data(), size).ok());
  EXPECT_EQ(bytes, std::vector<uint8_t>(size, 0));

  // A worker opening the handle sees the same bytes.
  const std::vector<uint8_t> pattern = PatternBytes(4096, 7);
  ASSERT_TRUE(
      runtime_
          .CopyToDevice((*pool)->backend_data(), pattern.data(), pattern.size())
          .ok());
  auto mapped = runtime_.IpcOpenMemHandle(1, e.handle);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  std::vector<uint8_t> seen(pattern.size());
  ASSERT_TRUE(runtime_.CopyToHost(seen.data(), *mapped, seen.size()).ok());
  EXPECT_EQ(seen, pattern);
  ASSERT_TRUE(runtime_.IpcCloseMemHandle(*mapped).ok());

  pool->reset();  // Frees the device memory.
  EXPECT_EQ(runtime_.GetDeviceInfo(1).value().free_bytes, *free_before);
}

TEST_F(CudaPoolBackendTest, DevicePoolErrorsNameRankDeviceSizeAndCall) {
  auto unmapped = backend_.CreateDevicePool(0, 4096);
  ASSERT_FALSE(unmapped.ok());
  EXPECT_EQ(unmapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unmapped.status().message(), HasSubstr("rank 0"));
  EXPECT_FALSE(backend_.CreateDevicePool(7, 4096).ok());
  EXPECT_FALSE(backend_.CreateDevicePool(1, 0).ok());

  auto too_big = backend_.CreateDevicePool(1, 65 << 20);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  for (const char* part :
       {"rank 1", "CUDA device 0", "68157440 bytes", "DeviceMalloc"}) {
    EXPECT_THAT(too_big.status().message(), HasSubstr(part));
  }

  runtime_.InjectFault(cuda::SimFault::kDeviceMalloc, 1,
                       absl::ResourceExhaustedError("out of memory"));
  auto injected = backend_.CreateDevicePool(3, 4096);
  ASSERT_FALSE(injected.ok());
  EXPECT_THAT(injected.status().message(), HasSubstr("CUDA device 1"));
  EXPECT_THAT(injected.status().message(), HasSubstr("out of memory"));
  EXPECT_EQ(runtime_.GetDeviceInfo(1).value().free_bytes, 64u << 20);
}

TEST_F(CudaPoolBackendTest, HostPoolIsPinnedSharedMemory) {
  const uint64_t size = 256 << 10;
  auto pool = backend_.CreateHostPool(1, size, /*lock_memory=*/false);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->name(), prefix_ + "-host-r1");
  EXPECT_EQ((*pool)->size_bytes(), size);
  ASSERT_NE((*pool)->host_data(), nullptr);
  EXPECT_EQ((*pool)->host_data(), (*pool)->backend_data());
  EXPECT_TRUE((*pool)->pinned());
  EXPECT_GE((*pool)->pin_time(), absl::ZeroDuration());
  const PoolExport e = (*pool)->Export();
  EXPECT_EQ(e.kind, PoolExport::Kind::kSharedMemory);
  EXPECT_EQ(e.handle, prefix_ + "-host-r1");
  EXPECT_EQ(e.size_bytes, size);
  EXPECT_TRUE(ShmExists(e.handle));

  // Registered: the device reaches it (a device-to-host copy lands).
  const std::vector<uint8_t> pattern = PatternBytes(size, 3);
  std::memcpy((*pool)->host_data(), pattern.data(), size);
  auto device = runtime_.DeviceMalloc(0, size);
  ASSERT_TRUE(device.ok());
  auto stream = runtime_.CreateStream(0);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(
      runtime_.MemcpyAsync(*device, (*pool)->host_data(), size, *stream).ok());
  ASSERT_TRUE(runtime_.SynchronizeStream(*stream).ok());
  std::vector<uint8_t> back(size);
  ASSERT_TRUE(runtime_.CopyToHost(back.data(), *device, size).ok());
  EXPECT_EQ(back, pattern);
  ASSERT_TRUE(runtime_.DestroyStream(*stream).ok());
  ASSERT_TRUE(runtime_.DeviceFree(0, *device).ok());

  // Unregistered before the segment goes: registering a new pool of the
  // same rank (likely the same address range) works.
  pool->reset();
  EXPECT_FALSE(ShmExists(e.handle));
  auto again = backend_.CreateHostPool(1, size, false);
  ASSERT_TRUE(again.ok()) << again.status();
}

TEST_F(CudaPoolBackendTest, HostPoolWithoutPinning) {
  CudaPoolBackend unpinned(&runtime_, {0}, prefix_, /*pin_host_memory=*/false);
  auto pool = unpinned.CreateHostPool(0, 4096, false);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE((*pool)->pinned());
  EXPECT_EQ((*pool)->pin_time(), absl::ZeroDuration());
}

TEST_F(CudaPoolBackendTest, HostRegisterFailureLeavesNoSegment) {
  runtime_.InjectFault(cuda::SimFault::kHostRegister, 1,
                       absl::InternalError("cannot pin"));
  auto pool = backend_.CreateHostPool(3, 8192, false);
  ASSERT_FALSE(pool.ok());
  for (const char* part : {"rank 3", "8192 bytes", "CUDA device 1",
                           "HostRegister", "cannot pin"}) {
    EXPECT_THAT(pool.status().message(), HasSubstr(part));
  }
  EXPECT_FALSE(ShmExists(prefix_ + "-host-r3"));
}

TEST_F(CudaPoolBackendTest, RankPoolsForServedRanksOnly) {
  auto layout = CpLayout::Create(64, 4, {1, 3});
  ASSERT_TRUE(layout.ok());
  auto geometry = KvGeometry::Preset("tiny-draft");
  ASSERT_TRUE(geometry.ok());
  auto pools = RankPools::Create(
      *layout, *geometry,
      RankPoolsOptions{.device_pages_per_rank = 4, .host_pages_per_rank = 6},
      backend_);
  ASSERT_TRUE(pools.ok()) << pools.status();
  for (Rank r : {0u, 2u}) {
    EXPECT_EQ((*pools)->device(r), nullptr);
    EXPECT_EQ((*pools)->host(r), nullptr);
  }
  EXPECT_EQ((*pools)->device(1)->Export().device, 0);
  EXPECT_EQ((*pools)->device(3)->Export().device, 1);
  EXPECT_EQ((*pools)->host(3)->size_bytes(), geometry->PoolBytes(6));
}

// --- CudaBackend -------------------------------------------------------------

TEST(CudaBackendTest, RefusesWithoutDevices) {
  auto backend = CudaBackend::Create(
      std::make_shared<cuda::SimCudaRuntime>(cuda::SimOptions{.devices = 0}),
      {});
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(backend.status().message(),
              HasSubstr("no CUDA device is visible"));
  EXPECT_EQ(CudaBackend::Create(nullptr, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaBackendTest, RefusesOutOfRangeDeviceMaps) {
  auto runtime =
      std::make_shared<cuda::SimCudaRuntime>(cuda::SimOptions{.devices = 2});
  for (std::vector<int> map : {std::vector<int>{0, 2}, {-2}, {1, 0, 5}}) {
    auto backend =
        CudaBackend::Create(runtime, CudaBackendOptions{.device_of_rank = map});
    ASSERT_FALSE(backend.ok());
    EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(backend.status().message(), HasSubstr("2 device(s)"));
  }
  auto ok = CudaBackend::Create(
      runtime, CudaBackendOptions{.device_of_rank = {-1, 1, -1, 0}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->name(), "cuda (simulated)");
  EXPECT_TRUE((*ok)->has_events());
  // Empty: rank r on device r.
  auto identity = CudaBackend::Create(runtime, {});
  ASSERT_TRUE(identity.ok());
  EXPECT_EQ((*identity)->options().device_of_rank, (std::vector<int>{0, 1}));
}

TEST(CudaBackendTest, CheckCapacityAgainstDeviceAndSharedMemory) {
  auto runtime = std::make_shared<cuda::SimCudaRuntime>(
      cuda::SimOptions{.devices = 2, .device_total_bytes = 8 << 20});
  auto backend = CudaBackend::Create(
      runtime, CudaBackendOptions{.device_of_rank = {0, 0, 1, 1},
                                  .shm_prefix = UniqueShmPrefix()});
  ASSERT_TRUE(backend.ok()) << backend.status();

  RankPools::Sizes sizes{.ranks = {0, 1, 2, 3},
                         .device_bytes_per_rank = 4 << 20,
                         .host_bytes_per_rank = 1 << 20};
  EXPECT_TRUE((*backend)->CheckCapacity(sizes).ok());

  // Two ranks share device 0: 2 x 5 MiB does not fit 8 MiB.
  sizes.device_bytes_per_rank = 5 << 20;
  absl::Status device = (*backend)->CheckCapacity(sizes);
  EXPECT_EQ(device.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* part : {"CUDA device 0", "10485760", "8388608"}) {
    EXPECT_THAT(device.message(), HasSubstr(part));
  }
  // Memory already taken counts.
  sizes.ranks = {2, 3};
  sizes.device_bytes_per_rank = 3 << 20;
  EXPECT_TRUE((*backend)->CheckCapacity(sizes).ok());
  auto taken = runtime->DeviceMalloc(1, 4 << 20);
  ASSERT_TRUE(taken.ok());
  EXPECT_THAT((*backend)->CheckCapacity(sizes).message(),
              HasSubstr("CUDA device 1"));
  ASSERT_TRUE(runtime->DeviceFree(1, *taken).ok());

  sizes.host_bytes_per_rank = uint64_t{1} << 50;
  absl::Status host = (*backend)->CheckCapacity(sizes);
  EXPECT_EQ(host.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(host.message(), HasSubstr("/dev/shm"));
}

TEST(CudaBackendTest, BuildsPoolsAndAnEngine) {
  auto runtime =
      std::make_shared<cuda::SimCudaRuntime>(cuda::SimOptions{.devices = 1});
  auto backend = CudaBackend::Create(
      runtime, CudaBackendOptions{.shm_prefix = UniqueShmPrefix()});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto layout = CpLayout::Create(64, 1);
  auto geometry = KvGeometry::Preset("tiny");
  ASSERT_TRUE(layout.ok() && geometry.ok());
  const RankPoolsOptions options{.device_pages_per_rank = 4,
                                 .host_pages_per_rank = 4};
  ASSERT_TRUE(
      (*backend)
          ->CheckCapacity(RankPools::SizesFor(*layout, *geometry, options))
          .ok());
  auto pools =
      RankPools::Create(*layout, *geometry, options, (*backend)->pools());
  ASSERT_TRUE(pools.ok()) << pools.status();
  testing::RecordingListener listener;
  auto engine = (*backend)->CreateTransferEngine(pools->get(), &listener);
  ASSERT_NE(engine, nullptr);
  TransferTask task{
      .op_id = 1,
      .direction = TransferDirection::kDeviceToHost,
      .step = 1,
      .ranks = {
          RankCopy{.rank = 0, .device_pages = {1, 2}, .host_pages = {3, 0}}}};
  ASSERT_TRUE(engine->Submit(task).ok());
  engine->Drain();
  ASSERT_EQ(listener.count(), 1u);
  EXPECT_TRUE(listener.dones()[0].status.ok());
  EXPECT_EQ(listener.dones()[0].bytes, 2 * geometry->BlockBytes(0));
}

}  // namespace
}  // namespace hicache
