// GroupFollower against a scripted leader end (a WireLink over a loopback
// pair): losing the leader -- the link breaking, a Bye, silence, a protocol
// error -- calls on_fatal exactly once with UNAVAILABLE naming the leader;
// Stop is not a loss and says Bye; Status follows; Run's preconditions.
#include "daemon/group/group_follower.h"

#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/wire_link.h"
#include "gtest/gtest.h"
#include "tests/group/group_test_util.h"

namespace hicache::group {
namespace {

using testing::FakeEngine;

constexpr absl::Duration kInterval = absl::Milliseconds(20);
constexpr absl::Duration kTimeout = absl::Milliseconds(300);
constexpr auto kWait =
    std::chrono::seconds(20);  // A hang fails, not times out.
constexpr uint64_t kEpoch = 7;

// The leader's end: records the kinds of the frames it receives.
class LeaderEnd {
 public:
  explicit LeaderEnd(std::unique_ptr<comm::Communicator> comm)
      : link_(std::move(comm), kEpoch) {}
  absl::Status Start() {
    return link_.Start(
        [this](Frame frame) {
          std::lock_guard<std::mutex> lock(mu_);
          kinds_.push_back(frame.header.kind);
          if (frame.header.kind == FrameKind::kBye) {
            bye_ = std::get<Bye>(frame.body).reason;
          }
          cv_.notify_all();
          return absl::OkStatus();
        },
        [](const absl::Status&) {});
  }
  WireLink& link() { return link_; }
  // Waits for a frame of `kind`; false after kWait.
  bool AwaitKind(FrameKind kind) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kWait, [&] {
      for (FrameKind k : kinds_) {
        if (k == kind) return true;
      }
      return false;
    });
  }
  std::string bye() {
    std::lock_guard<std::mutex> lock(mu_);
    return bye_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FrameKind> kinds_;
  std::string bye_;
  WireLink link_;  // Last: its threads use the above.
};

class GroupFollowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    follower_ = std::make_unique<GroupFollower>(
        GroupFollowerOptions{.group_name = "g",
                             .cp_size = 2,
                             .leader = "leader at 10.0.0.1:7070",
                             .scope = {.ranks = {1},
                                       .num_steps = 4,
                                       .device_pages_per_rank = 16,
                                       .host_pages_per_rank = 16},
                             .heartbeat_interval = kInterval,
                             .heartbeat_timeout = kTimeout,
                             .events = &hub_},
        [](TransferListener* l) { return std::make_unique<FakeEngine>(l); },
        [this](const absl::Status& cause) {
          if (++fatals_ == 1)
            fatal_.set_value(
                absl::Status(cause.code(), std::string(cause.message())));
        });
  }
  // Runs the follower over a fresh pair; the leader's end is returned
  // (its raw communicator in *raw).
  std::unique_ptr<LeaderEnd> Connect(comm::LoopbackCommunicator** raw) {
    auto [leader, follower] = comm::LoopbackCommunicator::CreatePair(
        "leader at 10.0.0.1:7070", "follower 1");
    if (raw != nullptr) *raw = leader.get();
    auto end = std::make_unique<LeaderEnd>(std::move(leader));
    EXPECT_TRUE(follower_->Run(std::move(follower), kEpoch, 1).ok());
    return end;
  }
  absl::Status AwaitFatal() {
    if (fatal_future_.wait_for(kWait) != std::future_status::ready) {
      return absl::DeadlineExceededError("on_fatal was not called");
    }
    return fatal_future_.get();
  }
  void ExpectFatalNamingTheLeader(const absl::Status& fatal,
                                  const std::string& cause) {
    EXPECT_EQ(fatal.code(), absl::StatusCode::kUnavailable) << fatal;
    EXPECT_NE(fatal.message().find(
                  "CP group g leader leader at 10.0.0.1:7070 lost: "),
              std::string::npos)
        << fatal;
    EXPECT_NE(fatal.message().find(cause), std::string::npos) << fatal;
    const GroupStatus status = follower_->Status();
    EXPECT_EQ(status.state, GroupState::kDegraded);
    EXPECT_EQ(status.reason, fatal.message());
    ASSERT_EQ(status.members.size(), 1u);
    EXPECT_FALSE(status.members[0].live);
  }

  EventHub hub_;  // The follower daemon's; outlives follower_.
  std::atomic<int> fatals_{0};
  std::promise<absl::Status> fatal_;
  std::future<absl::Status> fatal_future_ = fatal_.get_future();
  std::unique_ptr<GroupFollower> follower_;
};

TEST_F(GroupFollowerTest, StatusFollowsTheLinkAndStopIsNotALoss) {
  EXPECT_EQ(follower_->Status().state, GroupState::kForming);
  EXPECT_EQ(follower_->Status().role, GroupRole::kFollower);
  auto leader = Connect(nullptr);
  ASSERT_TRUE(leader->Start().ok());
  // The follower heartbeats; the leader's heartbeats keep it live.
  ASSERT_TRUE(leader->AwaitKind(FrameKind::kHeartbeat));
  ASSERT_TRUE(leader->link().Send(Heartbeat{.sender_time_ns = 1}).ok());
  GroupStatus status = follower_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  EXPECT_EQ(status.epoch, kEpoch);
  ASSERT_EQ(status.members.size(), 1u);
  EXPECT_TRUE(status.members[0].live);
  EXPECT_EQ(status.members[0].name, "leader at 10.0.0.1:7070");
  follower_->Stop();
  follower_->Stop();  // Idempotent.
  ASSERT_TRUE(leader->AwaitKind(FrameKind::kBye));
  EXPECT_NE(leader->bye().find("follower stopping"), std::string::npos);
  EXPECT_EQ(follower_->Status().state, GroupState::kStopped);
  EXPECT_EQ(fatals_.load(), 0);
  EXPECT_EQ(follower_->Run(nullptr, kEpoch).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GroupFollowerTest, RunTwiceOrWithoutALinkIsRefused) {
  EXPECT_EQ(follower_->Run(nullptr, kEpoch).code(),
            absl::StatusCode::kInvalidArgument);
  auto leader = Connect(nullptr);
  auto [a, b] = comm::LoopbackCommunicator::CreatePair("x", "y");
  EXPECT_EQ(follower_->Run(std::move(b), kEpoch).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GroupFollowerTest, LinkBreakIsFatalOnce) {
  comm::LoopbackCommunicator* raw = nullptr;
  auto leader = Connect(&raw);
  ASSERT_TRUE(leader->Start().ok());
  ASSERT_TRUE(leader->AwaitKind(FrameKind::kHeartbeat));
  raw->Break(absl::UnavailableError("the leader's host went away"));
  ExpectFatalNamingTheLeader(AwaitFatal(), "the leader's host went away");
  follower_->Stop();
  EXPECT_EQ(fatals_.load(), 1);
}

TEST_F(GroupFollowerTest, ByeIsFatalOnce) {
  auto leader = Connect(nullptr);
  ASSERT_TRUE(leader->Start().ok());
  ASSERT_TRUE(leader->link().Send(Bye{.reason = "leader stopping"}).ok());
  ExpectFatalNamingTheLeader(AwaitFatal(), "it said bye: leader stopping");
  leader.reset();  // Closing the link after the Bye is no second loss.
  follower_->Stop();
  EXPECT_EQ(fatals_.load(), 1);
}

TEST_F(GroupFollowerTest, SilenceIsFatalOnce) {
  // Before Run: the health's silence clock starts inside it.
  const auto start = std::chrono::steady_clock::now();
  auto leader = Connect(nullptr);
  ASSERT_TRUE(leader->Start().ok());  // Receives, never sends.
  const absl::Status fatal = AwaitFatal();
  const absl::Duration took =
      absl::FromChrono(std::chrono::steady_clock::now() - start);
  ExpectFatalNamingTheLeader(fatal, "nothing heard");
  EXPECT_GE(took, kTimeout);
  follower_->Stop();
  EXPECT_EQ(fatals_.load(), 1);
}

TEST_F(GroupFollowerTest, ProtocolErrorIsFatalOnce) {
  comm::LoopbackCommunicator* raw = nullptr;
  auto leader = Connect(&raw);
  // Not a frame: the follower's WireLink aborts the link.
  ASSERT_TRUE(raw->Send("garbage").ok());
  ExpectFatalNamingTheLeader(AwaitFatal(), "protocol error");
  follower_->Stop();
  EXPECT_EQ(fatals_.load(), 1);
}

TEST_F(GroupFollowerTest, StopRacingALossReportsAtMostOnce) {
  for (int round = 0; round < 20; ++round) {
    fatals_ = 0;
    fatal_ = std::promise<absl::Status>();
    fatal_future_ = fatal_.get_future();
    SetUp();
    comm::LoopbackCommunicator* raw = nullptr;
    auto leader = Connect(&raw);
    std::thread breaker(
        [raw] { raw->Break(absl::UnavailableError("racing the stop")); });
    follower_->Stop();
    breaker.join();
    EXPECT_LE(fatals_.load(), 1) << "round " << round;
    follower_.reset();
  }
}

// Worker events from the leader reach this daemon's subscribers once each,
// in order (docs/cp-groups.md, "Worker events and acks across the link");
// an event of a rank this follower does not hold is a protocol error.
TEST_F(GroupFollowerTest, LeadersWorkerEventsReachLocalSubscribers) {
  auto box = std::make_shared<EventMailbox>(64, [] {});
  hub_.Subscribe(1, "ns", box);
  auto other = std::make_shared<EventMailbox>(64, [] {});
  hub_.Subscribe(1, "other", other);
  auto leader = Connect(nullptr);
  ASSERT_TRUE(leader->Start().ok());
  WorkerEventBatch batch;
  for (uint32_t step = 0; step < 2; ++step) {
    batch.events.push_back({.op = 5,
                            .kind = WorkerEventKind::kBackupStep,
                            .rank = 1,
                            .step = step,
                            .ns = "ns"});
  }
  batch.events.push_back(
      {.op = 5, .kind = WorkerEventKind::kCommitted, .ns = "ns"});
  batch.events.push_back({.op = 6,
                          .kind = WorkerEventKind::kLoadStep,
                          .rank = 1,
                          .fence = "f",
                          .ns = "ns"});
  ASSERT_TRUE(leader->link().Send(batch).ok());
  // The load's outcome in a later frame: its tag is kept across frames.
  ASSERT_TRUE(leader->link()
                  .Send(WorkerEventBatch{.events = {{.op = 6,
                                                     .kind = WorkerEventKind::kLoadDone,
                                                     .ok = false,
                                                     .ns = "ns"}}})
                  .ok());
  std::vector<OpEvent> got;
  for (int i = 0; i < 5; ++i) {
    std::optional<OpEvent> e = box->Wait(absl::Now() + absl::Seconds(20));
    ASSERT_TRUE(e.has_value()) << i;
    got.push_back(*e);
  }
  EXPECT_EQ(got[0].type, OpEvent::Type::kBackupStep);
  EXPECT_EQ(got[1].step, 1u);
  EXPECT_EQ(got[2].type, OpEvent::Type::kCommitted);
  EXPECT_EQ(got[3].type, OpEvent::Type::kLoadStep);
  EXPECT_EQ(got[3].fence, "f");
  EXPECT_EQ(got[4].type, OpEvent::Type::kLoadDone);
  EXPECT_FALSE(got[4].ok);
  EXPECT_FALSE(box->Wait(absl::Now()).has_value()) << "a duplicate";
  EXPECT_FALSE(other->Wait(absl::Now()).has_value());
  // Rank 0 is not this follower's: the frame is refused, the leader lost.
  ASSERT_TRUE(leader->link()
                  .Send(WorkerEventBatch{.events = {{.op = 7,
                                                     .kind = WorkerEventKind::kBackupStep,
                                                     .rank = 0,
                                                     .ns = "ns"}}})
                  .ok());
  const absl::Status fatal = AwaitFatal();
  EXPECT_NE(fatal.message().find("does not hold"), std::string::npos) << fatal;
  EXPECT_FALSE(box->Wait(absl::Now()).has_value());
}

// A layer_stored from the leader is the wrong direction: a protocol error.
TEST_F(GroupFollowerTest, ALayerStoredFromTheLeaderIsAProtocolError) {
  auto leader = Connect(nullptr);
  ASSERT_TRUE(leader->Start().ok());
  ASSERT_TRUE(leader->link().Send(LayerStoredRequest{.rank = 1}).ok());
  const absl::Status fatal = AwaitFatal();
  EXPECT_NE(fatal.message().find("layer_stored"), std::string::npos) << fatal;
  // And nothing can be relayed any more.
  EXPECT_EQ(follower_->ForwardLayerStored("ns", 1, 0, {1}).code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hicache::group
