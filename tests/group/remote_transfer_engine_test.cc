#include "daemon/group/remote_transfer_engine.h"

#include <atomic>
#include <chrono>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/comm/loopback_communicator.h"
#include "daemon/group/follower_executor.h"
#include "daemon/group/group_wire.h"
#include "gtest/gtest.h"
#include "tests/group/group_test_util.h"

namespace hicache::group {
namespace {

using comm::LoopbackCommunicator;
using testing::FakeEngine;
using testing::MakeTask;
using testing::RecordingListener;

constexpr uint64_t kEpoch = 7;

RemoteMember Member() {
  return RemoteMember{.name = "follower 1",
                      .ranks = {1, 2},
                      .num_steps = 8,
                      .device_pages_per_rank = 64,
                      .host_pages_per_rank = 64};
}

FollowerScope Scope() {
  return FollowerScope{.leader = "leader",
                       .ranks = {1, 2},
                       .num_steps = 8,
                       .device_pages_per_rank = 64,
                       .host_pages_per_rank = 64};
}

// A leader's RemoteTransferEngine whose peer is a real FollowerExecutor over
// a FakeEngine.
class RemoteWithFollower : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [leader_end, follower_end] =
        LoopbackCommunicator::CreatePair("leader", "follower 1");
    leader_end_ = leader_end.get();
    follower_ = std::make_unique<FollowerExecutor>(
        Scope(), std::move(follower_end), kEpoch,
        [this](TransferListener* l) {
          auto engine = std::make_unique<FakeEngine>(l);
          fake_ = engine.get();
          return engine;
        });
    remote_ = std::make_unique<RemoteTransferEngine>(
        Member(), std::move(leader_end), kEpoch, &listener_);
    ASSERT_TRUE(follower_->Start().ok());
    ASSERT_TRUE(remote_->Start().ok());
  }

  RecordingListener listener_;
  LoopbackCommunicator* leader_end_ = nullptr;
  FakeEngine* fake_ = nullptr;
  std::unique_ptr<FollowerExecutor> follower_;
  std::unique_ptr<RemoteTransferEngine> remote_;
};

TEST_F(RemoteWithFollower, EveryStepCompletesOnceThroughTheFollower) {
  constexpr int kSteps = 8;
  for (uint32_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(remote_->Submit(MakeTask(3, step, {1, 2}, 5)).ok());
  }
  ASSERT_TRUE(listener_.WaitFor(2 * kSteps));
  remote_->Drain();
  EXPECT_EQ(listener_.count(), 2u * kSteps);
  for (const auto& [site, n] : listener_.PerSite()) EXPECT_EQ(n, 1);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(done.bytes, 50u);
  }
  EXPECT_FALSE(listener_.CalledOn(std::this_thread::get_id()));
  const RemoteTransferEngine::Stats stats = remote_->stats();
  EXPECT_EQ(stats.steps_submitted, 2 * kSteps);
  EXPECT_EQ(stats.steps_completed, 2 * kSteps);
  EXPECT_EQ(stats.outstanding, 0);
  EXPECT_GE(stats.task_frames, 1);
  EXPECT_LE(stats.task_frames, kSteps);  // Batched, never more than tasks.
  EXPECT_EQ(follower_->refused(), 0);
}

TEST_F(RemoteWithFollower, ManyOpsArriveInOrderAndCompleteOnce) {
  constexpr int kOps = 300;
  for (int op = 1; op <= kOps; ++op) {
    const uint32_t step = static_cast<uint32_t>(op % 8);
    ASSERT_TRUE(remote_->Submit(MakeTask(op, step, {2, 1}, op % 6)).ok());
  }
  remote_->Drain();
  ASSERT_EQ(listener_.count(), 2u * kOps);
  for (const auto& [site, n] : listener_.PerSite()) EXPECT_EQ(n, 1);
  // The follower ran them in submission order.
  const std::vector<TransferTask> seen = fake_->tasks();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kOps));
  for (int i = 0; i < kOps; ++i) {
    EXPECT_TRUE(SameTask(seen[i], MakeTask(i + 1, (i + 1) % 8, {2, 1},
                                           (i + 1) % 6)))
        << i;
  }
  // Completions come back in the follower's (FIFO) order too.
  const std::vector<StepDone> dones = listener_.dones();
  for (size_t i = 0; i < dones.size(); ++i) {
    EXPECT_EQ(dones[i].op_id, i / 2 + 1);
  }
}

TEST_F(RemoteWithFollower, LinkBreakingMidTaskFailsOutstandingStepsOnce) {
  fake_->Hold();
  for (uint32_t step = 0; step < 4; ++step) {
    ASSERT_TRUE(remote_->Submit(MakeTask(5, step, {1, 2})).ok());
  }
  // Two completions make it back; the other six are in flight.
  fake_->ReleaseSome(2);
  ASSERT_TRUE(listener_.WaitFor(2));
  leader_end_->Break(absl::UnavailableError("cable cut"));
  ASSERT_TRUE(listener_.WaitFor(8));
  // A later Submit is accepted and fails, never inside Submit.
  ASSERT_TRUE(remote_->Submit(MakeTask(6, 0, {1})).ok());
  ASSERT_TRUE(listener_.WaitFor(9));
  fake_->Release();  // The follower's late completions go nowhere.
  follower_->Drain();
  remote_->Drain();
  const std::vector<StepDone> dones = listener_.dones();
  ASSERT_EQ(dones.size(), 9u);
  int ok = 0;
  for (const StepDone& done : dones) {
    if (done.status.ok()) {
      ++ok;
      continue;
    }
    EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(done.status.message().find("cable cut"), std::string::npos)
        << done.status;
    EXPECT_EQ(done.bytes, 0u);
  }
  EXPECT_EQ(ok, 2);
  for (const auto& [site, n] : listener_.PerSite()) EXPECT_EQ(n, 1);
  EXPECT_FALSE(listener_.CalledOn(std::this_thread::get_id()));
  EXPECT_EQ(remote_->failure().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(remote_->stats().outstanding, 0);
}

TEST_F(RemoteWithFollower, FailByTheGroupLayerCompletesOutstandingOnce) {
  fake_->Hold();
  ASSERT_TRUE(remote_->Submit(MakeTask(8, 0, {1, 2})).ok());
  remote_->Fail(absl::DeadlineExceededError("no heartbeat for 1000 ms"));
  remote_->Fail(absl::InternalError("again"));  // Idempotent.
  ASSERT_TRUE(listener_.WaitFor(2));
  remote_->Drain();
  fake_->Release();
  follower_->Drain();
  const std::vector<StepDone> dones = listener_.dones();
  ASSERT_EQ(dones.size(), 2u);
  for (const StepDone& done : dones) {
    EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(done.status.message().find("no heartbeat"), std::string::npos);
  }
}

TEST_F(RemoteWithFollower, DrainWaitsForTheFollower) {
  fake_->Hold();
  ASSERT_TRUE(remote_->Submit(MakeTask(9, 1, {1, 2})).ok());
  std::future<void> drained =
      std::async(std::launch::async, [&] { remote_->Drain(); });
  // Not done while the follower holds the copies (a negative check: a wait
  // that ends early is the bug).
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  fake_->Release();
  drained.get();
  EXPECT_EQ(listener_.count(), 2u);
}

TEST_F(RemoteWithFollower, SubmitRefusesWhatTheFollowerWould) {
  struct Case {
    TransferTask task;
    std::string words;
  };
  std::vector<Case> cases;
  cases.push_back({MakeTask(1, 0, {0}), "not served"});
  cases.push_back({MakeTask(1, 0, {1, 1}), "twice"});
  cases.push_back({MakeTask(1, 8, {1}), "step 8"});
  TransferTask fenced = MakeTask(1, 0, {1});
  fenced.ranks[0].wait_fence = 3;
  cases.push_back({fenced, "fence"});
  TransferTask unpaired = MakeTask(1, 0, {1});
  unpaired.ranks[0].host_pages.pop_back();
  cases.push_back({unpaired, "host pages"});
  TransferTask outside = MakeTask(1, 0, {2});
  outside.ranks[0].device_pages[1] = 64;
  cases.push_back({outside, "outside"});
  TransferTask negative = MakeTask(1, 0, {2});
  negative.ranks[0].host_pages[0] = -1;
  cases.push_back({negative, "outside"});
  for (const Case& c : cases) {
    absl::Status s = remote_->Submit(c.task);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.words), std::string::npos) << s;
  }
  EXPECT_EQ(remote_->stats().steps_submitted, 0);
  EXPECT_TRUE(remote_->Submit(TransferTask{.op_id = 1}).ok());  // No ranks.
  remote_->Drain();
  EXPECT_EQ(listener_.count(), 0u);
  absl::StatusOr<uint64_t> fence = remote_->RegisterFence(1, "handle");
  EXPECT_EQ(fence.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(remote_->FenceRank(1).status().code(),
            absl::StatusCode::kNotFound);
}

// The leader's engine against a hand-driven follower end that misbehaves.
class RemoteWithHostilePeer : public ::testing::Test {
 protected:
  void SetUp() override {
    auto [leader_end, follower_end] =
        LoopbackCommunicator::CreatePair("leader", "follower 1");
    peer_ = std::move(follower_end);
    remote_ = std::make_unique<RemoteTransferEngine>(
        Member(), std::move(leader_end), kEpoch, &listener_);
    ASSERT_TRUE(remote_->Start().ok());
    ASSERT_TRUE(remote_->Submit(MakeTask(4, 2, {1, 2})).ok());
  }

  std::string Dones(std::vector<StepDone> dones, uint64_t seq = 1,
                    uint64_t epoch = kEpoch) {
    return EncodeFrame(epoch, seq, StepDoneBatch{std::move(dones)});
  }
  static StepDone Done(uint64_t op, Rank rank, uint32_t step) {
    return StepDone{.op_id = op,
                    .direction = TransferDirection::kDeviceToHost,
                    .rank = rank,
                    .step = step,
                    .status = absl::OkStatus(),
                    .bytes = 12345};
  }

  // The hostile frame never reached the listener: both submitted steps
  // complete UNAVAILABLE, once, and the link is dead.
  void ExpectAborted(const std::string& words) {
    ASSERT_TRUE(listener_.WaitFor(2));
    remote_->Drain();
    const std::vector<StepDone> dones = listener_.dones();
    ASSERT_EQ(dones.size(), 2u);
    for (const StepDone& done : dones) {
      EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
      EXPECT_EQ(done.bytes, 0u);
      EXPECT_NE(done.status.message().find(words), std::string::npos)
          << done.status;
    }
    for (const auto& [site, n] : listener_.PerSite()) EXPECT_EQ(n, 1);
    EXPECT_EQ(remote_->failure().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(remote_->stats().link.protocol_errors, 1);
    // And later frames are ignored: nothing more arrives.
    (void)peer_->Send(Dones({Done(4, 1, 2)}, 2));
    remote_->Drain();
    EXPECT_EQ(listener_.count(), 2u);
  }

  RecordingListener listener_;
  std::unique_ptr<LoopbackCommunicator> peer_;
  std::unique_ptr<RemoteTransferEngine> remote_;
};

TEST_F(RemoteWithHostilePeer, CompletionOfAnUnknownStep) {
  ASSERT_TRUE(peer_->Send(Dones({Done(4, 1, 3)})).ok());
  ExpectAborted("not outstanding");
}

TEST_F(RemoteWithHostilePeer, CompletionOfAForeignRank) {
  ASSERT_TRUE(peer_->Send(Dones({Done(4, 0, 2)})).ok());
  ExpectAborted("does not serve");
}

TEST_F(RemoteWithHostilePeer, OneBadCompletionSpoilsItsWholeFrame) {
  // The first completion is real, the second a duplicate: none is taken.
  ASSERT_TRUE(peer_->Send(Dones({Done(4, 1, 2), Done(4, 1, 2)})).ok());
  ExpectAborted("not outstanding");
}

TEST_F(RemoteWithHostilePeer, Garbage) {
  ASSERT_TRUE(peer_->Send(std::string("\x01\x04garbage", 9)).ok());
  ExpectAborted("protocol error");
}

TEST_F(RemoteWithHostilePeer, WrongEpoch) {
  ASSERT_TRUE(peer_->Send(Dones({Done(4, 1, 2)}, 1, kEpoch + 1)).ok());
  ExpectAborted("epoch 8");
}

TEST_F(RemoteWithHostilePeer, SkippedSequenceNumber) {
  ASSERT_TRUE(peer_->Send(Dones({Done(4, 1, 2)}, 2)).ok());
  ExpectAborted("sequence number 2, expected 1");
}

TEST_F(RemoteWithHostilePeer, TasksFromAFollower) {
  ASSERT_TRUE(
      peer_->Send(EncodeFrame(kEpoch, 1, TaskBatch{{MakeTask(1, 0, {1})}}))
          .ok());
  ExpectAborted("tasks frame");
}

TEST_F(RemoteWithHostilePeer, GoodCompletionsThenBye) {
  ASSERT_TRUE(peer_->Send(Dones({Done(4, 2, 2)})).ok());
  ASSERT_TRUE(listener_.WaitFor(1));
  EXPECT_TRUE(listener_.dones()[0].status.ok());
  EXPECT_EQ(listener_.dones()[0].bytes, 12345u);
  ASSERT_TRUE(peer_->Send(EncodeFrame(kEpoch, 2, Bye{"restarting"})).ok());
  ASSERT_TRUE(listener_.WaitFor(2));
  remote_->Drain();
  const StepDone last = listener_.dones()[1];
  EXPECT_EQ(last.rank, 1u);
  EXPECT_EQ(last.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(last.status.message().find("restarting"), std::string::npos);
}

TEST_F(RemoteWithHostilePeer, PeerClosingFailsOutstanding) {
  peer_.reset();
  ASSERT_TRUE(listener_.WaitFor(2));
  remote_->Drain();
  for (const StepDone& done : listener_.dones()) {
    EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
  }
}

TEST(RemoteTransferEngineTest, DestroyingCompletesOutstanding) {
  RecordingListener listener;
  auto [leader_end, follower_end] = LoopbackCommunicator::CreatePair();
  {
    RemoteTransferEngine remote(Member(), std::move(leader_end), kEpoch,
                                &listener);
    ASSERT_TRUE(remote.Start().ok());
    ASSERT_TRUE(remote.Submit(MakeTask(1, 0, {1, 2})).ok());
  }
  ASSERT_EQ(listener.count(), 2u);
  for (const StepDone& done : listener.dones()) {
    EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
  }
}

// What GroupLeader wires to MemberHealth::LinkFailed: the link breaking
// tells on_failure once, with the link's cause, the link already aborted
// and no lock of the engine's held (it reads the engine); a later Fail and
// the destructor do not tell it again.
TEST(RemoteTransferEngineTest, OnFailureIsToldOnceWhenTheLinkBreaks) {
  RecordingListener listener;
  auto [leader_end, follower_end] =
      LoopbackCommunicator::CreatePair("leader", "follower 1");
  LoopbackCommunicator* link = leader_end.get();
  struct Told {
    absl::Status cause;
    absl::Status failure;  // The engine's, read from inside on_failure.
    absl::Status control;  // A send from inside on_failure.
  };
  std::atomic<int> calls{0};
  std::promise<Told> told;
  std::future<Told> told_future = told.get_future();
  RemoteTransferEngine* engine = nullptr;  // Set before Start.
  {
    RemoteTransferEngine remote(
        Member(), std::move(leader_end), kEpoch, &listener,
        /*on_control=*/nullptr, RemoteTransferOptions{},
        [&](const absl::Status& cause) {
          if (++calls != 1) return;
          told.set_value(Told{.cause = CopyStatus(cause),
                              .failure = engine->failure(),
                              .control = engine->SendControl(Heartbeat{})});
        });
    engine = &remote;
    ASSERT_TRUE(remote.Start().ok());
    ASSERT_TRUE(remote.Submit(MakeTask(2, 0, {1})).ok());
    link->Break(absl::UnavailableError("cable cut"));
    // A hang guard only: the break reports within milliseconds.
    ASSERT_EQ(told_future.wait_for(std::chrono::seconds(60)),
              std::future_status::ready);
    const Told t = told_future.get();
    EXPECT_EQ(t.cause.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(t.cause.message().find("cable cut"), std::string::npos)
        << t.cause;
    EXPECT_EQ(t.failure.code(), absl::StatusCode::kUnavailable) << t.failure;
    EXPECT_FALSE(t.control.ok());  // The link was aborted first.
    ASSERT_TRUE(listener.WaitFor(1));
    EXPECT_EQ(listener.dones()[0].status.code(),
              absl::StatusCode::kUnavailable);
    remote.Fail(absl::InternalError("again"));
  }
  EXPECT_EQ(calls.load(), 1);
}

// Nothing failed it before: the destructor's CANCELLED is told, once.
TEST(RemoteTransferEngineTest, OnFailureIsToldOnceByTheDestructor) {
  RecordingListener listener;
  auto [leader_end, follower_end] = LoopbackCommunicator::CreatePair();
  std::vector<absl::Status> causes;  // Told on the destroying thread.
  auto record = [&](const absl::Status& cause) {
    causes.push_back(CopyStatus(cause));
  };
  {
    RemoteTransferEngine remote(Member(), std::move(leader_end), kEpoch,
                                &listener, /*on_control=*/nullptr,
                                RemoteTransferOptions{}, record);
    ASSERT_TRUE(remote.Start().ok());
  }
  ASSERT_EQ(causes.size(), 1u);
  EXPECT_EQ(causes[0].code(), absl::StatusCode::kCancelled) << causes[0];
}

}  // namespace
}  // namespace hicache::group

namespace hicache::group {
namespace {

// Pages alternating 0 and 2^62: every delta takes a 10-byte varint.
RankCopy WideCopy(Rank rank, size_t pages) {
  RankCopy copy{.rank = rank};
  for (size_t i = 0; i < pages; ++i) {
    const int64_t page = i % 2 ? int64_t{1} << 62 : 0;
    copy.device_pages.push_back(page);
    copy.host_pages.push_back(page);
  }
  return copy;
}

TEST(RemoteTransferEngineTest, TaskOverOneFrameIsSplitByRank) {
  RecordingListener listener;
  auto [leader_end, follower_end] = LoopbackCommunicator::CreatePair();
  FakeEngine* fake = nullptr;
  FollowerExecutor follower(
      FollowerScope{.leader = "leader",
                    .ranks = {1, 2},
                    .num_steps = 8,
                    .device_pages_per_rank = std::numeric_limits<int64_t>::max(),
                    .host_pages_per_rank = std::numeric_limits<int64_t>::max()},
      std::move(follower_end), kEpoch, [&](TransferListener* l) {
        auto engine = std::make_unique<FakeEngine>(l);
        fake = engine.get();
        return engine;
      });
  RemoteTransferEngine remote(RemoteMember{.name = "follower 1",
                                           .ranks = {1, 2}},
                              std::move(leader_end), kEpoch, &listener);
  ASSERT_TRUE(follower.Start().ok());
  ASSERT_TRUE(remote.Start().ok());
  // One rank's copy alone over the limit: refused up front.
  // About 19 bytes a page pair (10- and 9-byte varints alternate).
  constexpr size_t kTooMany = comm::kMaxFrameBytes / 18;
  TransferTask huge{.op_id = 1, .step = 0};
  huge.ranks.push_back(WideCopy(1, kTooMany));
  absl::Status s = remote.Submit(std::move(huge));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("do not fit"), std::string::npos) << s;
  // Two ranks that fit one frame each but not together: two frames.
  constexpr size_t kPages = comm::kMaxFrameBytes / 19 * 6 / 10;
  TransferTask wide{.op_id = 2, .step = 1};
  wide.ranks.push_back(WideCopy(1, kPages));
  wide.ranks.push_back(WideCopy(2, kPages));
  ASSERT_GT(EncodedTaskBytes(wide), comm::kMaxFrameBytes);
  ASSERT_TRUE(remote.Submit(std::move(wide)).ok());
  remote.Drain();
  ASSERT_EQ(listener.count(), 2u);
  for (const StepDone& done : listener.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(done.bytes, 10 * kPages);
  }
  EXPECT_EQ(remote.stats().task_frames, 2);
  const std::vector<TransferTask> ran = fake->tasks();
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_EQ(ran[0].ranks.size(), 1u);
  EXPECT_EQ(ran[0].ranks[0].device_pages.size(), kPages);
  EXPECT_EQ(ran[0].ranks[0].device_pages[1], int64_t{1} << 62);
}

}  // namespace
}  // namespace hicache::group
