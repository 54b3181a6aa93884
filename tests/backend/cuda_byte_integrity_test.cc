// The engine's byte-integrity stress run through the CUDA backend's own code
// (CudaPoolBackend, CudaTransferEngine: one batched launch per step, events,
// completion threads) on the simulated CUDA runtime, for C = 1, 2, 4, 8; then
// again with CUDA faults injected into the runtime (refused launches, failing
// event records and waits, asynchronous copy failures that poison a stream).
// Misses are allowed; wrong bytes and leaked pages are not.
//
// With HICACHE_CUDA_RUNTIME=real the stress without faults runs on the GPU
// (every rank on the machine's GPUs, wrapping around; skipped without one);
// the faults need the simulator.
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/backend/cuda/cuda_backend.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/core/kv_layout.h"
#include "daemon/engine/hicache_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"
#include "tests/testing/cuda_runtime_mode.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;
using cuda::SimCudaRuntime;
using cuda::SimFault;

constexpr uint32_t kP = Driver::kPageSize;

struct Rig {
  std::shared_ptr<SimCudaRuntime> sim;  // Null on a real GPU.
  std::shared_ptr<cuda::CudaRuntime> runtime;
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<HiCacheEngine> engine;
};

// The GPUs to run on with HICACHE_CUDA_RUNTIME=real (0 when none is
// visible); 0 on the simulator.
int RealGpus() {
  if (!testing::RealCudaRuntimeRequested()) return 0;
  absl::StatusOr<int> gpus = cuda::RealCudaRuntime().DeviceCount();
  return gpus.ok() ? *gpus : 0;
}

Rig MakeRig(uint32_t cp, EvictionPolicy policy, WritePolicy write,
            const KvLayout* layout = nullptr) {
  Rig rig;
  // Two ranks per simulated GPU, as on a node with more ranks than GPUs.
  int devices = static_cast<int>((cp + 1) / 2);
  if (testing::RealCudaRuntimeRequested()) {
    devices = std::min(devices, RealGpus());
    rig.runtime = std::make_shared<cuda::RealCudaRuntime>();
  } else {
    rig.sim = std::make_shared<SimCudaRuntime>(
        cuda::SimOptions{.devices = devices});
    rig.runtime = rig.sim;
  }
  std::vector<int> device_of_rank(cp);
  for (uint32_t r = 0; r < cp; ++r) {
    device_of_rank[r] = static_cast<int>(r / 2) % devices;
  }
  static int counter = 0;
  auto backend = CudaBackend::Create(
      rig.runtime,
      CudaBackendOptions{
          .device_of_rank = device_of_rank,
          .shm_prefix = absl::StrCat("/hicache-cbi-", getpid(), "-", counter++),
          .max_blocks_per_copy = 8});
  EXPECT_TRUE(backend.ok()) << backend.status();
  rig.backend = *std::move(backend);
  auto engine = HiCacheEngine::Create(
      {.page_size = kP,
       .cp_size = cp,
       .kv_preset = layout != nullptr ? layout->name : "tiny-draft",
       .kv_families = layout != nullptr ? layout->families
                                        : std::vector<KvFamily>{},
       .device_pages_per_rank = 1 + 48 / cp,
       .host_pages_per_rank = 1 + 96 / cp,
       .host_layout = cp % 2 ? HostLayout::kLayerFirst : HostLayout::kPageFirst,
       .write_policy = write,
       .write_through_threshold = 2,
       .eviction_policy = policy,
       .l1_free_room_pages = 1,
       .l2_free_room_pages = 1,
       .backend = rig.backend.get()});
  EXPECT_TRUE(engine.ok()) << engine.status();
  rig.engine = *std::move(engine);
  return rig;
}

void Drive(Rig& rig, uint32_t cp, int requests, bool faults) {
  Driver driver(rig.engine.get(), 2000 + cp, "");
  for (int step = 0; step < requests; ++step) {
    if (faults && step % 37 == 0) {
      // One synchronous refusal of each kind now and then: each fails
      // exactly one step, which rolls its backup back or makes its load a
      // miss.
      static constexpr SimFault kKinds[] = {
          SimFault::kLaunch, SimFault::kRecordEvent, SimFault::kStreamWait};
      rig.sim->InjectFault(kKinds[(step / 37) % 3]);
    }
    if (faults && step == requests / 2) {
      // An asynchronous copy failure poisons one stream for good: every
      // later step on it fails, the others keep working.
      rig.sim->InjectFault(SimFault::kAsyncCopy);
    }
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    if (step % 50 == 0) {
      ASSERT_TRUE(rig.engine->EnforceFreeRoom().ok());
    }
    // Copies overlap the requests in between; every 10th request they all
    // land first, so host copies exist whatever the simulated streams'
    // threads were given (without it, a run could see no load-back at all).
    if (step % 10 == 9) rig.engine->WaitForTransfers();
    const absl::Status invariants = rig.engine->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  rig.engine->WaitForTransfers();
  ASSERT_TRUE(rig.engine->CheckInvariants().ok());
  EXPECT_EQ(rig.engine->DeviceAllocatedPages(), rig.engine->TreeDevicePages());
  EXPECT_GT(driver.hits(), 0);
  if (!faults) {
    EXPECT_GT(driver.loads(), 0) << "pressure never forced a load-back";
    EXPECT_EQ(rig.engine->Stats().copy_failures, 0);
  } else {
    EXPECT_GT(rig.engine->Stats().copy_failures, 0);
  }
  if (rig.sim != nullptr) EXPECT_GT(rig.sim->launches(), 0);
}

class CudaByteIntegrityTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(CudaByteIntegrityTest, EveryHitHasTheBytesThatWereWritten) {
  const uint32_t cp = GetParam();
  if (testing::RealCudaRuntimeRequested() && RealGpus() == 0) {
    GTEST_SKIP() << "HICACHE_CUDA_RUNTIME=real but no GPU is visible";
  }
  Rig rig = MakeRig(cp, static_cast<EvictionPolicy>(cp % 5),
                    static_cast<WritePolicy>(cp % 3));
  ASSERT_NE(rig.engine, nullptr);
  EXPECT_EQ(rig.engine->backend_name(), rig.sim != nullptr
                                            ? "cuda (simulated)"
                                            : "cuda");
  ASSERT_NO_FATAL_FAILURE(Drive(rig, cp, 1500, /*faults=*/false));
}

TEST_P(CudaByteIntegrityTest, CudaFaultsNeverServeWrongBytes) {
  if (testing::RealCudaRuntimeRequested()) {
    GTEST_SKIP() << "needs the simulated runtime: injected CUDA faults";
  }
  const uint32_t cp = GetParam();
  Rig rig = MakeRig(cp, EvictionPolicy::kLru, WritePolicy::kWriteThrough);
  ASSERT_NE(rig.engine, nullptr);
  ASSERT_NO_FATAL_FAILURE(Drive(rig, cp, 1000, /*faults=*/true));
}

INSTANTIATE_TEST_SUITE_P(CpSizes, CudaByteIntegrityTest,
                         ::testing::Values(1u, 2u, 4u, 8u));

// A model's MHA layout from a layout file (--kv_layout_file): Llama 3 8B's
// K and V, 32 layers of 2 KiB rows, under the daemon's default policies at
// C = 1 and 2; the copy kernels move 64 (family, layer) blocks a page.
class CudaMhaLayoutTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(CudaMhaLayoutTest, EveryHitHasTheBytesThatWereWritten) {
  const uint32_t cp = GetParam();
  if (testing::RealCudaRuntimeRequested() && RealGpus() == 0) {
    GTEST_SKIP() << "HICACHE_CUDA_RUNTIME=real but no GPU is visible";
  }
  absl::StatusOr<KvLayout> layout = ParseKvLayout(R"({
      "name": "llama-3-8b",
      "attention": {"layers": 32, "kv_heads": 8, "head_dim": 128,
                    "dtype": "bf16"}})");
  ASSERT_TRUE(layout.ok()) << layout.status();
  Rig rig = MakeRig(cp, DaemonConfig::kDefaultEvictionPolicy,
                    DaemonConfig::kDefaultWritePolicy, &*layout);
  ASSERT_NE(rig.engine, nullptr);
  ASSERT_EQ(rig.engine->geometry().TargetBytesPerToken(), 131072u);
  ASSERT_NO_FATAL_FAILURE(Drive(rig, cp, 400, /*faults=*/false));
}

INSTANTIATE_TEST_SUITE_P(CpSizes, CudaMhaLayoutTest, ::testing::Values(1u, 2u));

}  // namespace
}  // namespace hicache
