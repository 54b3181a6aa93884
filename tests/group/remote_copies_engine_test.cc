// A real HiCacheEngine whose rank 1 is "remote": EngineOptions::wrap_transfer
// installs a RoutingTransferEngine that keeps rank 0's copies on the backend
// engine and sends rank 1's over a loopback link to a FollowerExecutor, which
// runs them on a second CpuTransferEngine over the same pools (what a
// follower daemon does over its own). The stress driver's random requests,
// backups, evictions and load-backs must see every byte right; after the
// link breaks, rank 1's copies fail (backups never commit, load-backs miss)
// and still no wrong byte is served and nothing leaks.
#include <cstdio>
#include <memory>
#include <tuple>
#include <utility>

#include "daemon/comm/loopback_communicator.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/group/follower_executor.h"
#include "daemon/group/remote_transfer_engine.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/pool/kv_geometry.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"

namespace hicache::group {
namespace {

using Driver = hicache::testing::RequestDriver;

constexpr uint32_t kP = Driver::kPageSize;
constexpr int64_t kDevicePages = 25;
constexpr int64_t kHostPages = 49;

class RemoteCopiesEngineTest : public ::testing::TestWithParam<WritePolicy> {
 protected:
  void SetUp() override {
    const uint32_t steps = KvGeometry::Preset("tiny-draft", kP)->NumSteps();
    EngineOptions options{.page_size = kP,
                          .cp_size = 2,
                          .kv_preset = "tiny-draft",
                          .device_pages_per_rank = kDevicePages,
                          .host_pages_per_rank = kHostPages,
                          .host_layout = HostLayout::kPageFirst,
                          .write_policy = GetParam(),
                          .write_through_threshold = 2,
                          .l1_free_room_pages = 1,
                          .l2_free_room_pages = 1};
    options.wrap_transfer = [this, steps](TransferListener* listener,
                                          const TransferEngineFactory& backend)
        -> std::unique_ptr<TransferEngine> {
      auto [leader_end, follower_end] =
          comm::LoopbackCommunicator::CreatePair("leader", "follower 1");
      link_ = leader_end.get();
      follower_ = std::make_unique<FollowerExecutor>(
          FollowerScope{.leader = "leader",
                        .ranks = {1},
                        .num_steps = steps,
                        .device_pages_per_rank = kDevicePages,
                        .host_pages_per_rank = kHostPages},
          std::move(follower_end), 1, backend);
      auto remote = std::make_shared<RemoteTransferEngine>(
          RemoteMember{.name = "follower 1",
                       .ranks = {1},
                       .num_steps = steps,
                       .device_pages_per_rank = kDevicePages,
                       .host_pages_per_rank = kHostPages},
          std::move(leader_end), 1, listener);
      remote_ = remote.get();
      EXPECT_TRUE(follower_->Start().ok());
      EXPECT_TRUE(remote->Start().ok());
      auto routing = std::make_unique<RoutingTransferEngine>(
          listener, backend(listener), std::vector<Rank>{0});
      EXPECT_TRUE(routing->SetRoute({1}, std::move(remote)).ok());
      return routing;
    };
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }
  void TearDown() override {
    if (engine_ != nullptr) engine_->WaitForTransfers();
    follower_.reset();  // Its engine copies into the engine's pools.
    engine_.reset();
  }

  void Run(Driver& driver, int requests) {
    for (int i = 0; i < requests; ++i) {
      ASSERT_NO_FATAL_FAILURE(driver.Request()) << "request " << i;
      if (i % 50 == 0) ASSERT_TRUE(engine_->EnforceFreeRoom().ok());
      const absl::Status invariants = engine_->CheckInvariants();
      ASSERT_TRUE(invariants.ok()) << "request " << i << ": " << invariants;
    }
  }
  void ExpectCleanEnd() {
    engine_->WaitForTransfers();
    const absl::Status invariants = engine_->CheckInvariants();
    EXPECT_TRUE(invariants.ok()) << invariants;
    EXPECT_EQ(engine_->DeviceAllocatedPages(), engine_->TreeDevicePages());
  }

  std::unique_ptr<HiCacheEngine> engine_;
  // Owned by the engine's transfer engine.
  comm::LoopbackCommunicator* link_ = nullptr;
  RemoteTransferEngine* remote_ = nullptr;
  // Destroyed before the engine (TearDown): its copies use the engine's pools.
  std::unique_ptr<FollowerExecutor> follower_;
};

TEST_P(RemoteCopiesEngineTest, EveryByteRightWithRank1Remote) {
  Driver driver(engine_.get(), 4242, "");
  ASSERT_NO_FATAL_FAILURE(Run(driver, 1500));
  ExpectCleanEnd();
  const EngineStats stats = engine_->Stats();
  const Driver::Counts& counts = driver.counts();
  const RemoteTransferEngine::Stats remote = remote_->stats();
  const FollowerExecutor::Stats follower = follower_->stats();
  std::printf(
      "%ld requests, %ld hits verified, %ld loads; backups %ld committed; "
      "remote: %ld steps in %ld task frames (%ld bytes, %.1f bytes/step), "
      "follower: %ld executed, %ld refused, %ld completion frames (%ld "
      "bytes)\n",
      counts.requests, counts.verified, counts.loads, stats.backups_committed,
      remote.steps_completed, remote.task_frames, remote.task_frame_bytes,
      remote.steps_submitted == 0
          ? 0.0
          : static_cast<double>(remote.task_frame_bytes) /
                static_cast<double>(remote.steps_submitted),
      follower.steps_executed, follower.steps_refused, follower.done_frames,
      follower.done_frame_bytes);
  EXPECT_GT(counts.verified, 0);
  EXPECT_GT(counts.loads, 0);
  EXPECT_GT(stats.backups_committed, 0);
  EXPECT_EQ(stats.copy_failures, 0);
  EXPECT_GT(remote.steps_completed, 0);
  EXPECT_EQ(remote.steps_completed, remote.steps_submitted);
  EXPECT_EQ(follower.steps_refused, 0);
  EXPECT_EQ(follower.steps_executed, remote.steps_completed);
}

TEST_P(RemoteCopiesEngineTest, LinkBreakFailsRank1CopiesWithoutWrongBytes) {
  Driver driver(engine_.get(), 777, "");
  ASSERT_NO_FATAL_FAILURE(Run(driver, 300));
  engine_->WaitForTransfers();
  const int64_t committed_before = engine_->Stats().backups_committed;
  link_->Break(absl::UnavailableError("follower 1 died"));
  ASSERT_NO_FATAL_FAILURE(Run(driver, 700));
  ExpectCleanEnd();
  const EngineStats stats = engine_->Stats();
  EXPECT_GT(stats.copy_failures, 0);
  EXPECT_EQ(remote_->failure().code(), absl::StatusCode::kUnavailable);
  EXPECT_GT(remote_->stats().steps_failed, 0);
  EXPECT_EQ(remote_->stats().outstanding, 0);
  // Backups that need rank 1 no longer commit; any that commit had no page
  // on rank 1 (rank 0 only) -- either way the driver checked every byte.
  EXPECT_GE(stats.backups_committed, committed_before);
  EXPECT_GT(stats.backups_failed, 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, RemoteCopiesEngineTest,
                         ::testing::Values(WritePolicy::kWriteThroughSelective,
                                           WritePolicy::kWriteBack));

}  // namespace
}  // namespace hicache::group
