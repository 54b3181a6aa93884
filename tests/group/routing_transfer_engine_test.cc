#include "daemon/group/routing_transfer_engine.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/comm/loopback_communicator.h"
#include "daemon/group/follower_executor.h"
#include "daemon/group/remote_transfer_engine.h"
#include "gtest/gtest.h"
#include "tests/group/group_test_util.h"

namespace hicache::group {
namespace {

using comm::LoopbackCommunicator;
using testing::FakeEngine;
using testing::MakeTask;
using testing::RecordingListener;

// Rank 0 local (a FakeEngine), rank 1 on a remote fake engine, rank 2 on
// another; rank 3 has no route.
class RoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto local = std::make_unique<FakeEngine>(&listener_);
    local_ = local.get();
    routing_ = std::make_unique<RoutingTransferEngine>(
        &listener_, std::move(local), std::vector<Rank>{0});
    remote1_ = std::make_shared<FakeEngine>(&listener_);
    remote2_ = std::make_shared<FakeEngine>(&listener_);
    ASSERT_TRUE(routing_->SetRoute({1}, remote1_).ok());
    ASSERT_TRUE(routing_->SetRoute({2}, remote2_).ok());
  }
  void TearDown() override {
    routing_.reset();
    remote1_.reset();
    remote2_.reset();
  }

  RecordingListener listener_;
  FakeEngine* local_ = nullptr;
  std::shared_ptr<FakeEngine> remote1_;
  std::shared_ptr<FakeEngine> remote2_;
  std::unique_ptr<RoutingTransferEngine> routing_;
};

TEST_F(RoutingTest, SplitsByOwnerAndFailsUnroutedRanksAsync) {
  ASSERT_TRUE(routing_->Submit(MakeTask(1, 0, {3, 2, 1, 0}, 3)).ok());
  routing_->Drain();
  ASSERT_EQ(listener_.count(), 4u);
  for (const auto& [site, n] : listener_.PerSite()) EXPECT_EQ(n, 1);
  for (const StepDone& done : listener_.dones()) {
    if (done.rank == 3) {
      EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
      EXPECT_NE(done.status.message().find("no live member"),
                std::string::npos);
    } else {
      EXPECT_TRUE(done.status.ok());
      EXPECT_EQ(done.bytes, 30u);
    }
  }
  EXPECT_FALSE(listener_.CalledOn(std::this_thread::get_id()));
  ASSERT_EQ(local_->tasks().size(), 1u);
  ASSERT_EQ(local_->tasks()[0].ranks.size(), 1u);
  EXPECT_EQ(local_->tasks()[0].ranks[0].rank, 0u);
  ASSERT_EQ(remote1_->tasks().size(), 1u);
  EXPECT_EQ(remote1_->tasks()[0].ranks[0].rank, 1u);
  EXPECT_EQ(remote1_->tasks()[0].op_id, 1u);
  ASSERT_EQ(remote2_->tasks().size(), 1u);
  EXPECT_EQ(remote2_->tasks()[0].ranks[0].rank, 2u);
  EXPECT_EQ(routing_->unrouted_steps(), 1);
}

TEST_F(RoutingTest, LocalRefusalQueuesNothing) {
  absl::Status s = routing_->Submit(MakeTask(1, 99, {0, 1, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  routing_->Drain();
  EXPECT_EQ(listener_.count(), 0u);
  EXPECT_TRUE(remote1_->tasks().empty());
}

TEST_F(RoutingTest, FirstRemoteRefusalQueuesNothingLaterOnesFailTheirRanks) {
  // No local rank: the first part's refusal refuses the task.
  absl::Status s = routing_->Submit(MakeTask(1, 99, {1, 2}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  routing_->Drain();
  EXPECT_EQ(listener_.count(), 0u);
  // A remote that refuses after the local part was queued: its rank fails.
  auto refusing = std::make_shared<FakeEngine>(&listener_, 5);
  ASSERT_TRUE(routing_->SetRoute({1}, refusing).ok());
  ASSERT_TRUE(routing_->Submit(MakeTask(2, 5, {0, 1})).ok());
  routing_->Drain();
  ASSERT_EQ(listener_.count(), 2u);
  for (const StepDone& done : listener_.dones()) {
    if (done.rank == 0) {
      EXPECT_TRUE(done.status.ok());
    } else {
      EXPECT_EQ(done.status.code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST_F(RoutingTest, DuplicateRankIsRefused) {
  absl::Status s = routing_->Submit(MakeTask(1, 0, {1, 0, 1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  routing_->Drain();
  EXPECT_EQ(listener_.count(), 0u);
  EXPECT_TRUE(local_->tasks().empty());
}

TEST_F(RoutingTest, RoutesChange) {
  EXPECT_EQ(routing_->SetRoute({0}, remote1_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(routing_->SetRoute({4}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  routing_->ClearRoute({1, 0});  // Rank 0 stays local.
  ASSERT_TRUE(routing_->Submit(MakeTask(1, 0, {0, 1})).ok());
  routing_->Drain();
  ASSERT_EQ(listener_.count(), 2u);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_EQ(done.status.ok(), done.rank == 0) << done.status;
  }
  ASSERT_TRUE(routing_->SetRoute({1, 3}, remote2_).ok());
  ASSERT_TRUE(routing_->Submit(MakeTask(2, 0, {1, 3})).ok());
  routing_->Drain();
  ASSERT_EQ(remote2_->tasks().size(), 1u);
  EXPECT_EQ(remote2_->tasks()[0].ranks.size(), 2u);
}

TEST_F(RoutingTest, FencesGetIdsOfTheirOwnAndRouteBack) {
  absl::StatusOr<uint64_t> f0 = routing_->RegisterFence(0, "h");
  absl::StatusOr<uint64_t> f1 = routing_->RegisterFence(1, "h");
  ASSERT_TRUE(f0.ok() && f1.ok());
  EXPECT_NE(*f0, *f1);  // Both engines answered 1.
  EXPECT_EQ(*routing_->FenceRank(*f0), 0u);
  EXPECT_EQ(*routing_->FenceRank(*f1), 1u);
  EXPECT_EQ(routing_->RegisterFence(3, "h").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(routing_->RegisterFence(0, "bad").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A task's fences are translated to the engines' ids.
  TransferTask task = MakeTask(1, 0, {0, 1});
  task.ranks[0].wait_fence = *f0;
  task.ranks[1].wait_fence = *f1;
  ASSERT_TRUE(routing_->Submit(task).ok());
  routing_->Drain();
  EXPECT_EQ(local_->tasks()[0].ranks[0].wait_fence, 1u);
  EXPECT_EQ(remote1_->tasks()[0].ranks[0].wait_fence, 1u);
  // A fence of another rank, or unknown, refuses the task.
  TransferTask wrong = MakeTask(2, 0, {1});
  wrong.ranks[0].wait_fence = *f0;
  EXPECT_EQ(routing_->Submit(wrong).code(),
            absl::StatusCode::kInvalidArgument);
  wrong.ranks[0].wait_fence = 999;
  EXPECT_EQ(routing_->Submit(wrong).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(routing_->ReleaseFence(*f1).ok());
  EXPECT_EQ(remote1_->FenceRank(1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(routing_->ReleaseFence(*f1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(routing_->FenceRank(*f1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RoutingTest, DrainDrainsEveryEngine) {
  remote2_->Hold();
  ASSERT_TRUE(routing_->Submit(MakeTask(1, 0, {0, 1, 2})).ok());
  std::thread release([&] {
    ASSERT_TRUE(listener_.WaitFor(2));
    remote2_->Release();
  });
  routing_->Drain();
  EXPECT_EQ(listener_.count(), 3u);
  release.join();
}

// The routing engine in front of a real RemoteTransferEngine whose follower
// is a FollowerExecutor over a FakeEngine: the leader-side stack, without a
// HiCacheEngine.
TEST(RoutingOverLinkTest, TwoRankTaskCompletesOnceThenLinkBreaks) {
  RecordingListener listener;
  auto [leader_end, follower_end] =
      LoopbackCommunicator::CreatePair("leader", "follower 1");
  LoopbackCommunicator* link = leader_end.get();
  FakeEngine* follower_engine = nullptr;
  FollowerExecutor follower(
      FollowerScope{.leader = "leader",
                    .ranks = {1},
                    .num_steps = 4,
                    .device_pages_per_rank = 16,
                    .host_pages_per_rank = 16},
      std::move(follower_end), 1, [&](TransferListener* l) {
        auto engine = std::make_unique<FakeEngine>(l);
        follower_engine = engine.get();
        return engine;
      });
  ASSERT_TRUE(follower.Start().ok());
  auto remote = std::make_shared<RemoteTransferEngine>(
      RemoteMember{.name = "follower 1", .ranks = {1}},
      std::move(leader_end), 1, &listener);
  ASSERT_TRUE(remote->Start().ok());
  auto local = std::make_unique<FakeEngine>(&listener);
  FakeEngine* local_engine = local.get();
  RoutingTransferEngine routing(&listener, std::move(local), {0});
  ASSERT_TRUE(routing.SetRoute({1}, remote).ok());

  for (uint32_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(routing.Submit(MakeTask(1, step, {0, 1}, 6)).ok());
  }
  routing.Drain();
  ASSERT_EQ(listener.count(), 8u);
  for (const auto& [site, n] : listener.PerSite()) EXPECT_EQ(n, 1);
  for (const StepDone& done : listener.dones()) {
    EXPECT_TRUE(done.status.ok());
    EXPECT_EQ(done.bytes, 60u);
  }
  EXPECT_EQ(follower_engine->tasks().size(), 4u);
  EXPECT_EQ(local_engine->tasks().size(), 4u);

  // The follower holds op 2's copies; the link breaks mid-task.
  follower_engine->Hold();
  for (uint32_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(routing.Submit(MakeTask(2, step, {0, 1}, 6)).ok());
  }
  ASSERT_TRUE(listener.WaitFor(12));  // The local half.
  link->Break(absl::UnavailableError("follower 1 died"));
  routing.Drain();
  ASSERT_TRUE(routing.Submit(MakeTask(3, 0, {0, 1})).ok());
  routing.Drain();
  follower_engine->Release();
  follower.Drain();
  ASSERT_EQ(listener.count(), 18u);
  for (const auto& [site, n] : listener.PerSite()) EXPECT_EQ(n, 1);
  int unavailable = 0;
  for (const StepDone& done : listener.dones()) {
    if (done.rank == 1 && done.op_id >= 2) {
      EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
      ++unavailable;
    } else {
      EXPECT_TRUE(done.status.ok()) << done.status;
    }
  }
  EXPECT_EQ(unavailable, 5);
}

}  // namespace
}  // namespace hicache::group
