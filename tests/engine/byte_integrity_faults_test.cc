// The byte-integrity stress test with transfer failures on: the same random
// requests, backups, evictions and load-backs through small pools, while a
// FaultyTransferEngine fails a seeded 3% of the (op, rank, step) copies of
// both directions and of the write-back copies. Failed copies are dropped
// (the destination keeps stale bytes), so a backup committed or a load
// attached despite a failure would serve wrong bytes and be caught. Every
// hit's bytes must match; nothing may leak.
#include <cstdio>
#include <tuple>
#include <vector>

#include "daemon/core/daemon_config.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;

constexpr uint32_t kP = Driver::kPageSize;
constexpr double kFailureRate = 0.03;

struct FaultyEngine {
  std::unique_ptr<HiCacheEngine> engine;
  FaultyTransferEngine* faults = nullptr;  // Owned by the engine.
};

FaultyEngine MakeEngine(uint32_t cp, EvictionPolicy policy, WritePolicy write,
                        uint64_t seed) {
  FaultyEngine out;
  EngineOptions options{
      .page_size = kP,
      .cp_size = cp,
      .kv_preset = "tiny-draft",
      .device_pages_per_rank = 1 + 48 / cp,
      .host_pages_per_rank = 1 + 96 / cp,
      .host_layout = cp % 2 ? HostLayout::kLayerFirst : HostLayout::kPageFirst,
      .write_policy = write,
      .write_through_threshold = 2,
      .eviction_policy = policy,
      .l1_free_room_pages = 1,
      .l2_free_room_pages = 1,
      // Rounds inside the calls that make them due: reproducible.
      .write_ahead_thread = false};
  options.wrap_transfer = [&out, seed](TransferListener* listener,
                                       const TransferEngineFactory& backend) {
    auto faults = std::make_unique<FaultyTransferEngine>(listener, backend);
    faults->SetRandom({.seed = seed,
                       .device_to_host = kFailureRate,
                       .host_to_device = kFailureRate});
    out.faults = faults.get();
    return faults;
  };
  auto engine = HiCacheEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  out.engine = *std::move(engine);
  return out;
}

// Invariants after the last request: nothing in flight, every allocated
// device page the tree's, every host page accounted for.
void ExpectCleanEnd(HiCacheEngine& engine) {
  engine.WaitForTransfers();
  const absl::Status invariants = engine.CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
  EXPECT_EQ(engine.DeviceAllocatedPages(), engine.TreeDevicePages());
}

void Report(const char* name, const FaultyEngine& f,
            const Driver::Counts& counts) {
  const EngineStats stats = f.engine->Stats();
  std::printf(
      "%s: %ld requests, %ld hits verified (%ld tokens), %ld loads done, "
      "%ld loads failed; %ld faults injected, %ld copy failures seen; "
      "backups: %ld committed, %ld failed, %ld write-back\n",
      name, counts.requests, counts.verified, counts.hit_tokens, counts.loads,
      counts.failed_loads, f.faults->injected(), stats.copy_failures,
      stats.backups_committed, stats.backups_failed, stats.write_back_backups);
  ::testing::Test::RecordProperty("requests",
                                  static_cast<int>(counts.requests));
  ::testing::Test::RecordProperty("verified",
                                  static_cast<int>(counts.verified));
  ::testing::Test::RecordProperty("faults",
                                  static_cast<int>(f.faults->injected()));
}

using Param = std::tuple<uint32_t, WritePolicy, EvictionPolicy>;

class ByteIntegrityWithFaultsTest : public ::testing::TestWithParam<Param> {};

TEST_P(ByteIntegrityWithFaultsTest, NoWrongByteAndNoLeakUnderFailures) {
  const auto [cp, write, eviction] = GetParam();
  FaultyEngine f = MakeEngine(cp, eviction, write, 500 + cp);
  Driver driver(f.engine.get(), 2000 + cp, "");
  for (int step = 0; step < 3000; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    if (step % 50 == 0) {
      ASSERT_TRUE(f.engine->EnforceFreeRoom().ok());
    }
    const absl::Status invariants = f.engine->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  ExpectCleanEnd(*f.engine);
  const EngineStats stats = f.engine->Stats();
  const Driver::Counts& counts = driver.counts();
  Report(::testing::UnitTest::GetInstance()->current_test_info()->name(), f,
         counts);
  // The failures happened and were handled, and the cache still worked.
  EXPECT_GT(f.faults->injected(), 0);
  EXPECT_EQ(stats.copy_failures, f.faults->injected());
  EXPECT_GT(stats.backups_failed, 0);
  EXPECT_GT(stats.backups_committed, 0);
  EXPECT_GT(counts.verified, 0);
  EXPECT_GT(counts.loads, 0) << "pressure never forced a load-back";
  EXPECT_GT(counts.failed_loads, 0) << "no load-back failed";
  EXPECT_EQ(stats.loads_failed, counts.failed_loads);
}

INSTANTIATE_TEST_SUITE_P(
    CpAndWritePolicy, ByteIntegrityWithFaultsTest,
    ::testing::Values(
        Param{1, WritePolicy::kWriteThrough, EvictionPolicy::kLfu},
        Param{2, WritePolicy::kWriteBack, EvictionPolicy::kFifo},
        Param{4, WritePolicy::kWriteThroughSelective, EvictionPolicy::kSlru},
        Param{8, WritePolicy::kWriteBack, EvictionPolicy::kPriority},
        // The daemon's default pair (issue 26), at C = 2 and 4.
        Param{2, DaemonConfig::kDefaultWritePolicy,
              DaemonConfig::kDefaultEvictionPolicy},
        Param{4, DaemonConfig::kDefaultWritePolicy,
              DaemonConfig::kDefaultEvictionPolicy}));

// Several scheduler threads drive one engine while transfers, some of them
// failing, complete on worker threads (run under --config=tsan too).
TEST(ByteIntegrityWithFaultsConcurrencyTest, ManyThreadsOneEngine) {
  FaultyEngine f = MakeEngine(2, EvictionPolicy::kLru,
                              WritePolicy::kWriteThroughSelective, 99);
  const testing::ConcurrentDrive run =
      testing::DriveConcurrently(f.engine.get(), 177, 400);
  EXPECT_EQ(run.failed_threads, 0);
  ExpectCleanEnd(*f.engine);
  const Driver::Counts& total = run.total;
  Report("ManyThreadsOneEngine", f, total);
  EXPECT_GT(f.faults->injected(), 0);
  EXPECT_GT(total.verified, 0);
}

}  // namespace
}  // namespace hicache
