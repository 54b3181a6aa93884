#include "daemon/group/follower_executor.h"

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/comm/loopback_communicator.h"
#include "daemon/group/copy_digest.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/wire_link.h"
#include "gtest/gtest.h"
#include "tests/group/group_test_util.h"

namespace hicache::group {
namespace {

using comm::LoopbackCommunicator;
using testing::FakeEngine;
using testing::MakeTask;

constexpr uint64_t kEpoch = 3;

// The test plays the leader over a WireLink: it sends tasks and collects the
// completions the follower sends back.
class FollowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [leader_end, follower_end] =
        LoopbackCommunicator::CreatePair("leader", "follower");
    leader_raw_ = leader_end.get();
    leader_ = std::make_unique<WireLink>(std::move(leader_end), kEpoch);
    follower_ = std::make_unique<FollowerExecutor>(
        FollowerScope{.leader = "leader",
                      .ranks = {2, 3},
                      .num_steps = 4,
                      .device_pages_per_rank = 16,
                      .host_pages_per_rank = 32},
        std::move(follower_end), kEpoch,
        [this](TransferListener* l) {
          // The fake refuses step 3, which passes the follower's checks.
          auto engine = std::make_unique<FakeEngine>(l, 3);
          fake_ = engine.get();
          return engine;
        },
        nullptr, [this](const absl::Status& cause) {
          std::lock_guard<std::mutex> lock(mu_);
          ++follower_failures_;
          follower_cause_ = cause;
          cv_.notify_all();
        });
    ASSERT_TRUE(leader_
                    ->Start(
                        [this](Frame frame) {
                          std::lock_guard<std::mutex> lock(mu_);
                          if (frame.header.kind == FrameKind::kDigestResult) {
                            results_.push_back(
                                std::get<DigestResult>(frame.body));
                            cv_.notify_all();
                            return absl::OkStatus();
                          }
                          if (frame.header.kind != FrameKind::kStepDones) {
                            return absl::InvalidArgumentError("not dones");
                          }
                          ++frames_;
                          for (StepDone& d :
                               std::get<StepDoneBatch>(frame.body).dones) {
                            dones_.push_back(std::move(d));
                          }
                          cv_.notify_all();
                          return absl::OkStatus();
                        },
                        [](const absl::Status&) {})
                    .ok());
    ASSERT_TRUE(follower_->Start().ok());
  }
  void TearDown() override {
    follower_.reset();
    leader_.reset();
  }

  bool WaitDones(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return dones_.size() >= n; });
  }
  bool WaitFollowerFailure() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return follower_failures_ > 0; });
  }
  std::vector<StepDone> dones() {
    std::lock_guard<std::mutex> lock(mu_);
    return dones_;
  }
  bool WaitResults(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return results_.size() >= n; });
  }
  // The leader's tally of what the test ships (the follower's bounds).
  static CopyTally LeaderTally() { return CopyTally({2, 3}, 16, 32); }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StepDone> dones_;
  std::vector<DigestResult> results_;
  int frames_ = 0;
  int follower_failures_ = 0;
  absl::Status follower_cause_;
  LoopbackCommunicator* leader_raw_ = nullptr;
  FakeEngine* fake_ = nullptr;
  std::unique_ptr<WireLink> leader_;
  std::unique_ptr<FollowerExecutor> follower_;
};

TEST_F(FollowerTest, ExecutesTasksAndSendsCompletionsBack) {
  TaskBatch batch;
  for (uint32_t step = 0; step < 3; ++step) {
    batch.tasks.push_back(MakeTask(11, step, {2, 3}, 5));
  }
  ASSERT_TRUE(leader_->Send(batch).ok());
  ASSERT_TRUE(WaitDones(6));
  follower_->Drain();
  std::map<std::pair<Rank, uint32_t>, int> seen;
  for (const StepDone& d : dones()) {
    EXPECT_TRUE(d.status.ok());
    EXPECT_EQ(d.op_id, 11u);
    EXPECT_EQ(d.bytes, 50u);
    ++seen[{d.rank, d.step}];
  }
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_EQ(fake_->tasks().size(), 3u);
  const FollowerExecutor::Stats stats = follower_->stats();
  EXPECT_EQ(stats.tasks_received, 3);
  EXPECT_EQ(stats.steps_executed, 6);
  EXPECT_EQ(stats.steps_refused, 0);
  EXPECT_EQ(stats.pending, 0);
  EXPECT_GE(stats.done_frames, 1);
  EXPECT_LE(stats.done_frames, 6);
}

TEST_F(FollowerTest, BatchesCompletionsThatAccumulated) {
  // Hold every completion, release them together: they leave in few frames.
  fake_->Hold();
  TaskBatch batch;
  for (uint32_t op = 1; op <= 50; ++op) {
    batch.tasks.push_back(MakeTask(op, 0, {2, 3}));
  }
  ASSERT_TRUE(leader_->Send(batch).ok());
  fake_->Release();
  ASSERT_TRUE(WaitDones(100));
  follower_->Drain();
  EXPECT_LT(follower_->stats().done_frames, 100);
}

TEST_F(FollowerTest, RefusesCopiesItMustNotRunAndNeverExecutesThem) {
  TransferTask task = MakeTask(21, 1, {2, 3, 1}, 2);  // Rank 1: not served.
  task.ranks[1].device_pages[1] = 16;                 // Outside the pool.
  TransferTask fenced = MakeTask(22, 1, {2}, 1);
  fenced.ranks[0].wait_fence = 9;
  TransferTask unpaired = MakeTask(23, 1, {3}, 2);
  unpaired.ranks[0].host_pages.push_back(0);
  TransferTask step = MakeTask(24, 4, {2}, 1);  // Outside the geometry.
  TransferTask twice = MakeTask(25, 0, {2, 2}, 1);
  TransferTask host = MakeTask(26, 0, {3}, 1);
  host.ranks[0].host_pages[0] = 32;
  TransferTask negative = MakeTask(27, 0, {3}, 1);
  negative.ranks[0].device_pages[0] = -4;
  ASSERT_TRUE(leader_
                  ->Send(TaskBatch{{task, fenced, unpaired, step, twice, host,
                                    negative}})
                  .ok());
  ASSERT_TRUE(WaitDones(10));
  follower_->Drain();
  using Key = std::pair<uint64_t, Rank>;
  std::map<Key, absl::Status> by_site;
  for (const StepDone& d : dones()) by_site[Key(d.op_id, d.rank)] = d.status;
  EXPECT_TRUE(by_site[Key(21, 2)].ok());
  for (auto site : std::vector<std::pair<uint64_t, Rank>>{
           {21, 3}, {21, 1}, {22, 2}, {23, 3}, {24, 2}, {26, 3}, {27, 3}}) {
    EXPECT_EQ(by_site[site].code(), absl::StatusCode::kInvalidArgument)
        << site.first << "/" << site.second << ": " << by_site[site];
  }
  // Op 25: the first rank 2 runs, the second is refused.
  EXPECT_EQ(follower_->refused(), 8);
  EXPECT_NE(by_site[Key(21, 1)].message().find("not served"),
            std::string::npos);
  EXPECT_NE(by_site[Key(21, 3)].message().find("outside"), std::string::npos);
  // Only what passed reached the local engine.
  const std::vector<TransferTask> ran = fake_->tasks();
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_EQ(ran[0].op_id, 21u);
  ASSERT_EQ(ran[0].ranks.size(), 1u);
  EXPECT_EQ(ran[0].ranks[0].rank, 2u);
  EXPECT_EQ(ran[1].op_id, 25u);
  EXPECT_EQ(ran[1].ranks.size(), 1u);
}

TEST_F(FollowerTest, LocalRefusalIsAnsweredWithItsError) {
  ASSERT_TRUE(leader_->Send(TaskBatch{{MakeTask(31, 3, {3, 2}, 1)}}).ok());
  ASSERT_TRUE(WaitDones(2));
  follower_->Drain();
  for (const StepDone& d : dones()) {
    EXPECT_EQ(d.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status.message().find("refused by the fake"),
              std::string::npos);
  }
  const FollowerExecutor::Stats stats = follower_->stats();
  EXPECT_EQ(stats.steps_rejected, 2);
  EXPECT_EQ(stats.steps_refused, 0);
  EXPECT_EQ(stats.pending, 0);
}

TEST_F(FollowerTest, CompletionsFromTheLeaderAreAProtocolError) {
  ASSERT_TRUE(leader_->Send(StepDoneBatch{{StepDone{.rank = 2}}}).ok());
  ASSERT_TRUE(WaitFollowerFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(follower_failures_, 1);
  EXPECT_EQ(follower_cause_.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(follower_cause_.message().find("step_dones frame"),
            std::string::npos);
}

TEST_F(FollowerTest, GarbageIsAProtocolErrorAndNothingRuns) {
  std::string frame = EncodeFrame(kEpoch, 1, TaskBatch{{MakeTask(1, 0, {2})}});
  frame.back() ^= 0x40;  // A varint that no longer ends where it should.
  frame.push_back('\0');
  ASSERT_TRUE(leader_raw_->Send(frame).ok());
  ASSERT_TRUE(WaitFollowerFailure());
  EXPECT_TRUE(fake_->tasks().empty());
  EXPECT_EQ(follower_->stats().link.protocol_errors, 1);
}

TEST_F(FollowerTest, LosingTheLeaderIsReportedOnceAndDrainReturns) {
  fake_->Hold();
  ASSERT_TRUE(leader_->Send(TaskBatch{{MakeTask(41, 0, {2, 3})}}).ok());
  leader_.reset();  // The leader closes its end.
  ASSERT_TRUE(WaitFollowerFailure());
  fake_->Release();
  follower_->Drain();  // Late completions are dropped, not waited for.
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(follower_failures_, 1);
  EXPECT_EQ(follower_cause_.code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hicache::group

namespace hicache::group {
namespace {

TEST_F(FollowerTest, MatchingDigestIsAnsweredWithItsView) {
  CopyTally leader = LeaderTally();
  TaskBatch batch{{MakeTask(51, 0, {2, 3}, 3),
                   MakeTask(52, 1, {3}, 2, TransferDirection::kHostToDevice)}};
  leader.CountFrame();
  for (const TransferTask& t : batch.tasks) leader.AddTask(t);
  ASSERT_TRUE(leader_->Send(batch).ok());
  ASSERT_TRUE(leader_->Send(leader.Snapshot()).ok());
  ASSERT_TRUE(WaitResults(1));
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_TRUE(results_[0].match);
    EXPECT_EQ(results_[0].tasks_frames, 1u);
    EXPECT_EQ(results_[0].ranks, leader.Snapshot().ranks);
    EXPECT_EQ(follower_failures_, 0);
  }
  const FollowerExecutor::Stats stats = follower_->stats();
  EXPECT_EQ(stats.digests_checked, 1);
  EXPECT_EQ(stats.digests_matched, 1);
  EXPECT_FALSE(stats.diverged);
  EXPECT_NE(stats.last_digest_match, absl::InfinitePast());
}

TEST_F(FollowerTest, DivergenceIsFatalOnceAndNothingMoreRuns) {
  CopyTally leader = LeaderTally();
  TaskBatch batch{{MakeTask(61, 0, {2, 3}, 3)}};
  leader.CountFrame();
  leader.AddTask(batch.tasks[0]);
  leader.SkewForTesting(2, 1);  // The leader thinks one more page moved.
  ASSERT_TRUE(leader_->Send(batch).ok());
  ASSERT_TRUE(leader_->Send(leader.Snapshot()).ok());
  ASSERT_TRUE(WaitResults(1));
  ASSERT_TRUE(WaitFollowerFailure());
  {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(results_[0].match);
    EXPECT_EQ(follower_cause_.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(follower_cause_.message().find(
                  "diverged from the leader's at tasks frame 1: rank 2 "
                  "pages device->host: leader 4, follower 3"),
              std::string::npos)
        << follower_cause_;
  }
  EXPECT_TRUE(follower_->stats().diverged);
  // Later copies are answered, not run.
  ASSERT_TRUE(leader_->Send(TaskBatch{{MakeTask(62, 0, {2})}}).ok());
  ASSERT_TRUE(WaitDones(3));
  follower_->Drain();
  EXPECT_EQ(fake_->tasks().size(), 1u);
  for (const StepDone& d : dones()) {
    if (d.op_id == 62) {
      EXPECT_EQ(d.status.code(), absl::StatusCode::kAborted) << d.status;
    }
  }
  // The link failing afterwards is not reported again.
  leader_.reset();
  follower_->Drain();
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(follower_failures_, 1);
}

TEST_F(FollowerTest, ARefusedCopyIsADivergence) {
  CopyTally leader = LeaderTally();
  TaskBatch batch{{MakeTask(71, 0, {3}, 2)}};
  batch.tasks[0].ranks[0].host_pages[1] = 32;  // Outside the host pool.
  leader.CountFrame();
  leader.AddTask(batch.tasks[0]);
  ASSERT_TRUE(leader_->Send(batch).ok());
  ASSERT_TRUE(leader_->Send(leader.Snapshot()).ok());
  ASSERT_TRUE(WaitResults(1));
  ASSERT_TRUE(WaitFollowerFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_FALSE(results_[0].match);
  EXPECT_NE(follower_cause_.message().find(
                "rank 3 copies refused: leader 0, follower 1"),
            std::string::npos)
      << follower_cause_;
}

TEST_F(FollowerTest, DigestResultFromTheLeaderIsAProtocolError) {
  ASSERT_TRUE(leader_->Send(DigestResult{.match = true}).ok());
  ASSERT_TRUE(WaitFollowerFailure());
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_EQ(follower_cause_.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(follower_cause_.message().find("digest_result frame"),
            std::string::npos)
      << follower_cause_;
}

}  // namespace
}  // namespace hicache::group
