// Byte-integrity stress test: thousands of random requests, backups,
// evictions and load-backs through small pools under heavy pressure, over
// the configuration matrix (tests/testing/config_matrix.h): the daemon's
// default pair (write_ahead + tinylfu) at C = 1, 2, 4, 8 on every run, a
// fixed mix of other policies, and a logged sample of the rest (all of it
// with HICACHE_FULL_MATRIX=1). Every (rank, page, layer, family) row
// carries a pattern derived from the token prefix it holds; every hit's
// bytes must match it. Misses are allowed; wrong bytes and leaked pages are
// not; the engine's invariants hold after every request.
#include <vector>

#include "daemon/core/kv_layout.h"
#include "daemon/engine/hicache_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"
#include "tests/testing/config_matrix.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;

constexpr uint32_t kP = Driver::kPageSize;

std::unique_ptr<HiCacheEngine> MakeEngine(uint32_t cp, EvictionPolicy policy,
                                          WritePolicy write,
                                          bool l2_pressure = true,
                                          const KvLayout* layout = nullptr) {
  auto engine = HiCacheEngine::Create(
      {.page_size = kP,
       .cp_size = cp,
       .kv_preset = layout != nullptr ? layout->name : "tiny-draft",
       .kv_families = layout != nullptr ? layout->families
                                        : std::vector<KvFamily>{},
       .device_pages_per_rank = 1 + 48 / cp,
       .host_pages_per_rank = 1 + (l2_pressure ? 96 : 512) / cp,
       .host_layout = cp % 2 ? HostLayout::kLayerFirst : HostLayout::kPageFirst,
       .write_policy = write,
       .write_through_threshold = 2,
       .eviction_policy = policy,
       .l1_free_room_pages = 1,
       .l2_free_room_pages = 1,
       // Rounds inside the calls that make them due: reproducible.
       .write_ahead_thread = false});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

using testing::EngineConfig;

class ByteIntegrityTest : public ::testing::TestWithParam<EngineConfig> {};

TEST_P(ByteIntegrityTest, EveryHitHasTheBytesThatWereWritten) {
  const EngineConfig& config = GetParam();
  const uint32_t cp = config.cp;
  auto engine =
      MakeEngine(cp, config.eviction, config.write, config.l2_pressure);
  Driver driver(engine.get(), 1000 + cp, "");
  for (int step = 0; step < 3000; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    if (step % 50 == 0) {
      ASSERT_TRUE(engine->EnforceFreeRoom().ok());
    }
    const absl::Status invariants = engine->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->CheckInvariants().ok());
  // No request holds pages now: every allocated page is the tree's.
  EXPECT_EQ(engine->DeviceAllocatedPages(), engine->TreeDevicePages());
  EXPECT_GT(driver.hits(), 0);
  if (config.l2_pressure || config.write != WritePolicy::kWriteThrough) {
    EXPECT_GT(driver.loads(), 0) << "pressure never forced a load-back";
  }
  const EngineStats stats = engine->Stats();
  RecordProperty("loads", static_cast<int>(stats.loads_done));
  RecordProperty("backups", static_cast<int>(stats.backups_committed));
}

std::string CaseName(const ::testing::TestParamInfo<EngineConfig>& info) {
  return info.param.Name();
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, ByteIntegrityTest,
    ::testing::ValuesIn(testing::ConfigMatrixForThisRun("byte_integrity_test",
                                                        /*sampled=*/6)),
    CaseName);
// A fixed mix of the other policies, on every run (the cases this test
// ran before the matrix).
INSTANTIATE_TEST_SUITE_P(
    Mixed, ByteIntegrityTest,
    ::testing::Values(
        EngineConfig{1, WritePolicy::kWriteThroughSelective,
                     EvictionPolicy::kLfu},
        EngineConfig{2, WritePolicy::kWriteBack, EvictionPolicy::kFifo},
        EngineConfig{4, WritePolicy::kWriteThroughSelective,
                     EvictionPolicy::kSlru},
        EngineConfig{8, WritePolicy::kWriteBack, EvictionPolicy::kPriority}),
    CaseName);

// A model's MHA layout from a layout file (--kv_layout_file): Llama 3 8B's
// K and V, 32 layers of 2 KiB rows (128 KiB a token), under the daemon's
// default policies at C = 1 and 2.
class MhaLayoutByteIntegrityTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(MhaLayoutByteIntegrityTest, EveryHitHasTheBytesThatWereWritten) {
  const uint32_t cp = GetParam();
  absl::StatusOr<KvLayout> layout = ParseKvLayout(R"({
      "name": "llama-3-8b",
      "attention": {"layers": 32, "kv_heads": 8, "head_dim": 128,
                    "dtype": "bf16"}})");
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto engine = MakeEngine(cp, DaemonConfig::kDefaultEvictionPolicy,
                           DaemonConfig::kDefaultWritePolicy,
                           /*l2_pressure=*/true, &*layout);
  ASSERT_NE(engine, nullptr);
  ASSERT_EQ(engine->geometry().TargetBytesPerToken(), 131072u);
  ASSERT_EQ(engine->geometry().NumSteps(), 32u);
  Driver driver(engine.get(), 3000 + cp, "");
  for (int step = 0; step < 600; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    const absl::Status invariants = engine->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->CheckInvariants().ok());
  EXPECT_EQ(engine->DeviceAllocatedPages(), engine->TreeDevicePages());
  EXPECT_GT(driver.hits(), 0);
  EXPECT_GT(driver.loads(), 0) << "pressure never forced a load-back";
}

INSTANTIATE_TEST_SUITE_P(CpSizes, MhaLayoutByteIntegrityTest,
                         ::testing::Values(1u, 2u));

// Several scheduler threads drive one engine while transfers complete on
// worker threads (run under --config=tsan too).
TEST(ByteIntegrityConcurrencyTest, ManyThreadsOneEngine) {
  auto engine =
      MakeEngine(2, EvictionPolicy::kLru, WritePolicy::kWriteThroughSelective);
  // Two threads share a namespace, two have their own.
  EXPECT_EQ(testing::DriveConcurrently(engine.get(), 77, 400).failed_threads,
            0);
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
  EXPECT_EQ(engine->DeviceAllocatedPages(), engine->TreeDevicePages());
}

}  // namespace
}  // namespace hicache
