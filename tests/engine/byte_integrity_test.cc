// Byte-integrity stress test: thousands of random requests, backups,
// evictions and load-backs through small pools under heavy pressure, for
// C = 1, 2, 4, 8. Every (rank, page, layer, family) row carries a pattern
// derived from the token prefix it holds; every hit's bytes must match it.
// Misses are allowed; wrong bytes and leaked pages are not.
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;

constexpr uint32_t kP = Driver::kPageSize;

std::unique_ptr<HiCacheEngine> MakeEngine(uint32_t cp, EvictionPolicy policy,
                                          WritePolicy write) {
  auto engine = HiCacheEngine::Create(
      {.page_size = kP,
       .cp_size = cp,
       .kv_preset = "tiny-draft",
       .device_pages_per_rank = 1 + 48 / cp,
       .host_pages_per_rank = 1 + 96 / cp,
       .host_layout = cp % 2 ? HostLayout::kLayerFirst : HostLayout::kPageFirst,
       .write_policy = write,
       .write_through_threshold = 2,
       .eviction_policy = policy,
       .l1_free_room_pages = 1,
       .l2_free_room_pages = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

class ByteIntegrityTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ByteIntegrityTest, EveryHitHasTheBytesThatWereWritten) {
  const uint32_t cp = GetParam();
  auto engine = MakeEngine(cp, static_cast<EvictionPolicy>(cp % 5),
                           static_cast<WritePolicy>(cp % 3));
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
  EXPECT_GT(driver.loads(), 0) << "pressure never forced a load-back";
  const EngineStats stats = engine->Stats();
  RecordProperty("loads", static_cast<int>(stats.loads_done));
  RecordProperty("backups", static_cast<int>(stats.backups_committed));
}

INSTANTIATE_TEST_SUITE_P(CpSizes, ByteIntegrityTest,
                         ::testing::Values(1u, 2u, 4u, 8u));

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
