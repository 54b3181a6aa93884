// WritePolicy::kWriteAhead (issue 25): the byte-integrity stress through
// small pools under heavy pressure, C = 1, 2, 4, with the LRU and TinyLFU
// policies. After every request the invariants hold, including the
// prefix-closed host tier (every host copy has its ancestors' copies); no
// allocation or load ever waits for a copy; the cold end is copied ahead of
// eviction (victims demoted, not only dropped) and loads come back with the
// right bytes.
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;

std::unique_ptr<HiCacheEngine> MakeEngine(uint32_t cp, EvictionPolicy policy) {
  auto engine = HiCacheEngine::Create(
      {.page_size = Driver::kPageSize,
       .cp_size = cp,
       .kv_preset = "tiny-draft",
       .device_pages_per_rank = 1 + 48 / cp,
       .host_pages_per_rank = 1 + 96 / cp,
       .host_layout = cp % 2 ? HostLayout::kLayerFirst : HostLayout::kPageFirst,
       .write_policy = WritePolicy::kWriteAhead,
       .eviction_policy = policy,
       .l1_free_room_pages = 1,
       .l2_free_room_pages = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

class WriteAheadTest
    : public ::testing::TestWithParam<std::tuple<uint32_t, EvictionPolicy>> {};

TEST_P(WriteAheadTest, ClosedHostTierNoWaitsAndTheRightBytes) {
  const auto [cp, policy] = GetParam();
  auto engine = MakeEngine(cp, policy);
  ASSERT_NE(engine, nullptr);
  Driver driver(engine.get(), 4000 + cp, "");
  for (int step = 0; step < 2000; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    if (step % 50 == 0) {
      ASSERT_TRUE(engine->EnforceFreeRoom().ok());
    }
    const absl::Status invariants = engine->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->CheckInvariants().ok());
  EXPECT_EQ(engine->DeviceAllocatedPages(), engine->TreeDevicePages());
  const EngineStats stats = engine->Stats();
  EXPECT_EQ(stats.copy_waits, 0);
  EXPECT_GT(stats.write_ahead_backups, 0);
  EXPECT_GT(stats.device_victims_to_host, 0) << "nothing was demoted";
  EXPECT_GT(driver.hits(), 0);
  EXPECT_GT(driver.loads(), 0) << "pressure never forced a load-back";
}

INSTANTIATE_TEST_SUITE_P(
    CpAndPolicy, WriteAheadTest,
    ::testing::Combine(::testing::Values(1u, 2u, 4u),
                       ::testing::Values(EvictionPolicy::kLru,
                                         EvictionPolicy::kTinyLfu)),
    [](const auto& info) {
      return "C" + std::to_string(std::get<0>(info.param)) + "_" +
             std::string(PolicyName(std::get<1>(info.param)));
    });

// Several scheduler threads on one engine (run under --config=tsan too).
TEST(WriteAheadConcurrencyTest, ManyThreadsOneEngine) {
  auto engine = MakeEngine(2, EvictionPolicy::kTinyLfu);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(testing::DriveConcurrently(engine.get(), 91, 300).failed_threads,
            0);
  engine->WaitForTransfers();
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
  EXPECT_EQ(engine->Stats().copy_waits, 0);
}

// Admit's per-layer write-through under each write policy
// (HiCacheEngine::BacksUpAtAdmit, HostCopyCanJoin): write_ahead backs up a
// request's new pages only where the copy joins the prefix-closed host tier
// (its hit has a copy, or is empty) and displaces nothing (the free host
// pages beyond the free-room target hold it).
TEST(BacksUpAtAdmitTest, WriteAheadCopiesWhatJoinsTheClosedTierAndFits) {
  for (WritePolicy policy :
       {WritePolicy::kWriteAhead, WritePolicy::kWriteThrough,
        WritePolicy::kWriteBack, WritePolicy::kWriteThroughSelective}) {
    auto created = HiCacheEngine::Create({.page_size = Driver::kPageSize,
                                          .cp_size = 1,
                                          .kv_preset = "tiny-draft",
                                          .device_pages_per_rank = 16,
                                          .host_pages_per_rank = 4,
                                          .write_policy = policy,
                                          .l2_free_room_pages = 1});
    ASSERT_TRUE(created.ok()) << created.status();
    HiCacheEngine& e = **created;
    auto three = e.Allocate(3);
    auto four = e.Allocate(4);
    ASSERT_TRUE(three.ok() && four.ok());
    // A node on device without a host copy.
    const std::vector<int32_t> tokens(Driver::kPageSize * 3, 7);
    auto inserted = e.Insert("", tokens, *three);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    const NodeId uncopied = inserted->node;
    const bool ahead = policy == WritePolicy::kWriteAhead;
    const bool through = policy == WritePolicy::kWriteThrough;
    EXPECT_TRUE(e.HostCopyCanJoin(kNoNode));
    EXPECT_EQ(e.HostCopyCanJoin(uncopied), !ahead) << PolicyName(policy);
    // 3 pages fit 4 free host pages less 1 of free room; 4 do not.
    const std::vector<LogicalPage> first3(four->begin(), four->begin() + 3);
    EXPECT_EQ(e.BacksUpAtAdmit(kNoNode, first3), ahead || through)
        << PolicyName(policy);
    EXPECT_EQ(e.BacksUpAtAdmit(kNoNode, *four), through) << PolicyName(policy);
    EXPECT_EQ(e.BacksUpAtAdmit(uncopied, first3), through)
        << PolicyName(policy);
    ASSERT_TRUE(e.Free(*four).ok());
    EXPECT_TRUE(e.CheckInvariants().ok()) << e.CheckInvariants();
  }
}

}  // namespace
}  // namespace hicache
