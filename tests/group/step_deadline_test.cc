// RemoteTransferEngine's step deadline and its side of the accounting
// digest, against a scripted follower end over a LoopbackCommunicator: a
// follower that accepts Tasks but never answers fails the engine after the
// step timeout (not before), answers in time never trip it, an unanswered
// digest fails it too, a digest result that disagrees fails it once with
// both views named, a hostile digest frame is a protocol error, no digest
// traffic when the interval is 0, and the failure reaches a MemberHealth
// the way GroupLeader wires it.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/comm/loopback_communicator.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/member_health.h"
#include "daemon/group/remote_transfer_engine.h"
#include "daemon/group/wire_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/group/group_test_util.h"

namespace hicache::group {
namespace {

using comm::LoopbackCommunicator;
using testing::MakeTask;
using testing::RecordingListener;
using SteadyClock = std::chrono::steady_clock;

constexpr uint64_t kEpoch = 5;

RemoteMember Member() {
  return RemoteMember{.name = "follower 1",
                      .ranks = {1, 2},
                      .num_steps = 8,
                      .device_pages_per_rank = 64,
                      .host_pages_per_rank = 64};
}

// The follower's end, scripted: records every frame; answers Tasks (OK) and
// Digests (echoing the leader's tallies, optionally skewed) when told to.
class ScriptedFollower {
 public:
  struct Script {
    bool answer_tasks = false;
    bool answer_digests = false;
    int64_t skew_pages = 0;  // Added to rank 1's pages_d2h in the answer.
  };

  ScriptedFollower(std::unique_ptr<LoopbackCommunicator> end, Script script)
      : raw_(end.get()), script_(script), link_(std::move(end), kEpoch) {}

  void Start() {
    ASSERT_TRUE(link_
                    .Start([this](Frame frame) { return OnFrame(std::move(frame)); },
                           [this](const absl::Status& cause) {
                             std::lock_guard<std::mutex> lock(mu_);
                             failures_.push_back(cause);
                             cv_.notify_all();
                           })
                    .ok());
  }
  WireLink& link() { return link_; }
  LoopbackCommunicator* raw() { return raw_; }

  int Count(FrameKind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (FrameKind k : kinds_) n += k == kind;
    return n;
  }
  bool WaitCount(FrameKind kind, int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] {
      int c = 0;
      for (FrameKind k : kinds_) c += k == kind;
      return c >= n;
    });
  }
  // The link failed (the engine aborted it): its cause.
  absl::Status WaitFailure() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(30),
                      [&] { return !failures_.empty(); })) {
      return absl::OkStatus();
    }
    return failures_.front();
  }

 private:
  absl::Status OnFrame(Frame frame) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      kinds_.push_back(frame.header.kind);
      cv_.notify_all();
    }
    if (frame.header.kind == FrameKind::kTasks && script_.answer_tasks) {
      StepDoneBatch dones;
      for (const TransferTask& task : std::get<TaskBatch>(frame.body).tasks) {
        for (const RankCopy& copy : task.ranks) {
          dones.dones.push_back(StepDone{.op_id = task.op_id,
                                         .direction = task.direction,
                                         .rank = copy.rank,
                                         .step = task.step,
                                         .status = absl::OkStatus(),
                                         .bytes = 1});
        }
      }
      (void)link_.Send(dones);
    }
    if (frame.header.kind == FrameKind::kDigest && script_.answer_digests) {
      const Digest& d = std::get<Digest>(frame.body);
      DigestResult result{.tasks_frames = d.tasks_frames,
                          .match = script_.skew_pages == 0,
                          .ranks = d.ranks};
      for (RankTally& t : result.ranks) {
        if (t.rank == 1) t.pages_d2h += script_.skew_pages;
      }
      (void)link_.Send(result);
    }
    return absl::OkStatus();
  }

  LoopbackCommunicator* const raw_;
  const Script script_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<FrameKind> kinds_;
  std::vector<absl::Status> failures_;
  // Last: destroyed first, joining the thread that runs the handlers.
  WireLink link_;
};

class StepDeadlineTest : public ::testing::Test {
 protected:
  void Make(RemoteTransferOptions options, ScriptedFollower::Script script) {
    auto [leader_end, follower_end] =
        LoopbackCommunicator::CreatePair("leader", "follower 1");
    peer_ = std::make_unique<ScriptedFollower>(std::move(follower_end), script);
    options.on_digest = [this](uint64_t frames, bool match) {
      std::lock_guard<std::mutex> lock(mu_);
      digests_.push_back({frames, match});
      cv_.notify_all();
    };
    remote_ = std::make_unique<RemoteTransferEngine>(
        Member(), std::move(leader_end), kEpoch, &listener_, nullptr,
        std::move(options));
    peer_->Start();
    ASSERT_TRUE(remote_->Start().ok());
  }
  void TearDown() override {
    remote_.reset();
    peer_.reset();
  }
  // Submits a step the peer will not answer; once the engine failed it
  // completes (so the failure is recorded when this returns true).
  void Probe() { ASSERT_TRUE(remote_->Submit(MakeTask(40, 0, {1})).ok()); }
  bool ProbeFailed() { return listener_.WaitFor(1); }
  bool WaitDigests(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return digests_.size() >= n; });
  }
  std::vector<std::pair<uint64_t, bool>> digests() {
    std::lock_guard<std::mutex> lock(mu_);
    return digests_;
  }

  RecordingListener listener_;
  std::unique_ptr<ScriptedFollower> peer_;
  std::unique_ptr<RemoteTransferEngine> remote_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, bool>> digests_;
};

TEST_F(StepDeadlineTest, SilentFollowerFailsAfterTheTimeoutNotBefore) {
  constexpr auto kTimeout = std::chrono::milliseconds(300);
  Make({.step_timeout = absl::FromChrono(kTimeout),
        .digest_interval = absl::ZeroDuration()},
       {});
  const SteadyClock::time_point start = SteadyClock::now();
  ASSERT_TRUE(remote_->Submit(MakeTask(4, 2, {1, 2})).ok());
  ASSERT_TRUE(peer_->WaitCount(FrameKind::kTasks, 1));  // It got the task.
  ASSERT_TRUE(listener_.WaitFor(2));
  EXPECT_GE(SteadyClock::now() - start, kTimeout);
  remote_->Drain();
  for (const StepDone& done : listener_.dones()) {
    EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(done.status.message().find("did not answer op 4 d2h rank "),
              std::string::npos)
        << done.status;
    EXPECT_NE(done.status.message().find("step 2 for "), std::string::npos);
    EXPECT_NE(done.status.message().find("(step timeout 300ms)"),
              std::string::npos)
        << done.status;
  }
  for (const auto& [site, n] : listener_.PerSite()) EXPECT_EQ(n, 1);
  EXPECT_FALSE(listener_.CalledOn(std::this_thread::get_id()));
  EXPECT_EQ(remote_->failure().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(remote_->stats().step_timeouts, 1);
  EXPECT_EQ(remote_->stats().outstanding, 0);
  // As on a link failure: the link is aborted (both ends), so the member's
  // heartbeats are refused from now on, and later steps fail too.
  EXPECT_FALSE(remote_->SendControl(Heartbeat{}).ok());
  EXPECT_FALSE(peer_->WaitFailure().ok());
  ASSERT_TRUE(remote_->Submit(MakeTask(5, 0, {1})).ok());
  ASSERT_TRUE(listener_.WaitFor(3));
  EXPECT_EQ(listener_.dones()[2].status.code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(StepDeadlineTest, AnswersInTimeNeverTripIt) {
  // Steps answered at once for three timeouts; digests answered too.
  constexpr auto kTimeout = std::chrono::milliseconds(1000);
  Make({.step_timeout = absl::FromChrono(kTimeout),
        .digest_interval = absl::Milliseconds(20)},
       {.answer_tasks = true, .answer_digests = true});
  const SteadyClock::time_point start = SteadyClock::now();
  size_t expected = 0;
  uint64_t op = 1;
  while (SteadyClock::now() - start < 3 * kTimeout) {
    ASSERT_TRUE(remote_->Submit(MakeTask(op++, 1, {1, 2})).ok());
    expected += 2;
    ASSERT_TRUE(listener_.WaitFor(expected));
  }
  remote_->Drain();
  EXPECT_TRUE(remote_->failure().ok()) << remote_->failure();
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
  }
  const RemoteTransferEngine::Stats stats = remote_->stats();
  EXPECT_EQ(stats.step_timeouts, 0);
  EXPECT_GE(stats.digests_sent, 1);
  EXPECT_GE(stats.digests_matched, stats.digests_sent - 1);
  EXPECT_EQ(stats.digest_divergences, 0);
  EXPECT_NE(stats.last_digest_match, absl::InfinitePast());
}

TEST_F(StepDeadlineTest, NothingOutstandingNeverTimesOut) {
  Make({.step_timeout = absl::Milliseconds(50),
        .digest_interval = absl::ZeroDuration()},
       {.answer_tasks = true});
  ASSERT_TRUE(remote_->Submit(MakeTask(1, 0, {1})).ok());
  ASSERT_TRUE(listener_.WaitFor(1));
  // Idle for many timeouts (a negative check).
  std::promise<void> never;
  EXPECT_EQ(never.get_future().wait_for(std::chrono::milliseconds(400)),
            std::future_status::timeout);
  EXPECT_TRUE(remote_->failure().ok()) << remote_->failure();
  EXPECT_TRUE(remote_->SendControl(Heartbeat{}).ok());
}

TEST_F(StepDeadlineTest, UnansweredDigestFailsAtTheDeadline) {
  Make({.step_timeout = absl::Milliseconds(300),
        .digest_interval = absl::Milliseconds(20)},
       {});  // Answers nothing.
  ASSERT_TRUE(peer_->WaitCount(FrameKind::kDigest, 1));
  EXPECT_FALSE(peer_->WaitFailure().ok());
  const absl::Status failure = remote_->failure();
  EXPECT_EQ(failure.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(failure.message().find(
                "did not answer the accounting digest of tasks frame 0"),
            std::string::npos)
      << failure;
  // One digest at a time: none sent while the first waited.
  EXPECT_EQ(peer_->Count(FrameKind::kDigest), 1);
}

TEST_F(StepDeadlineTest, NoDigestTrafficWhenTheIntervalIsZero) {
  Make({.step_timeout = absl::Seconds(10),
        .digest_interval = absl::ZeroDuration()},
       {.answer_tasks = true, .answer_digests = true});
  for (uint64_t op = 1; op <= 20; ++op) {
    ASSERT_TRUE(remote_->Submit(MakeTask(op, 0, {1, 2})).ok());
  }
  remote_->Drain();
  std::promise<void> never;
  EXPECT_EQ(never.get_future().wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout);
  EXPECT_EQ(peer_->Count(FrameKind::kDigest), 0);
  EXPECT_EQ(remote_->stats().digests_sent, 0);
  EXPECT_TRUE(remote_->failure().ok());
}

TEST_F(StepDeadlineTest, DivergentResultFailsOnceNamingBothViews) {
  Make({.step_timeout = absl::Seconds(30),
        .digest_interval = absl::Milliseconds(10)},
       {.answer_digests = true, .skew_pages = 1});  // Tasks unanswered.
  ASSERT_TRUE(remote_->Submit(MakeTask(9, 3, {1, 2})).ok());
  ASSERT_TRUE(listener_.WaitFor(2));
  remote_->Drain();
  const absl::Status failure = remote_->failure();
  EXPECT_EQ(failure.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failure.message().find("pool accounting diverged at tasks frame"),
            std::string::npos)
      << failure;
  // The follower's view is the leader's plus the skew, at whichever frame
  // the digest covered: the first digest may go out before the task (it did
  // under TSan on a busy machine: "leader 0, follower 1"), or after it
  // ("leader 4, follower 5").
  int leader_pages = -1;
  int follower_pages = -1;
  const std::string message(failure.message());
  const size_t at = message.find("rank 1 pages device->host: leader ");
  ASSERT_NE(at, std::string::npos) << failure;
  ASSERT_EQ(std::sscanf(message.c_str() + at,
                        "rank 1 pages device->host: leader %d, follower %d",
                        &leader_pages, &follower_pages),
            2)
      << failure;
  EXPECT_TRUE(leader_pages == 0 || leader_pages == 4) << failure;
  EXPECT_EQ(follower_pages, leader_pages + 1) << failure;
  for (const StepDone& done : listener_.dones()) {
    EXPECT_EQ(done.status.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(done.status.message().find("pool accounting diverged"),
              std::string::npos);
  }
  EXPECT_FALSE(peer_->WaitFailure().ok());  // The link was aborted.
  ASSERT_TRUE(WaitDigests(1));
  const auto seen = digests();
  // Only the digests before the task's frame could match; the first one
  // that covered it failed the engine, and none came after.
  EXPECT_FALSE(seen.back().second);
  int mismatches = 0;
  for (const auto& [frames, match] : seen) mismatches += !match;
  EXPECT_EQ(mismatches, 1);
  EXPECT_EQ(remote_->stats().digest_divergences, 1);
}

TEST_F(StepDeadlineTest, DigestResultWithNoDigestOutstandingIsAProtocolError) {
  Make({.digest_interval = absl::ZeroDuration()}, {});
  Probe();
  ASSERT_TRUE(peer_->link().Send(DigestResult{.match = true}).ok());
  ASSERT_TRUE(ProbeFailed());
  EXPECT_FALSE(peer_->WaitFailure().ok());
  // The protocol error (DATA_LOSS) or the link's failure it caused
  // (UNAVAILABLE, naming it) is recorded first, whichever thread gets there:
  // under load both orders happen (tools/dev test --under-load).
  EXPECT_THAT(remote_->failure().code(),
              ::testing::AnyOf(absl::StatusCode::kDataLoss,
                               absl::StatusCode::kUnavailable));
  EXPECT_NE(remote_->failure().message().find("no digest outstanding"),
            std::string::npos)
      << remote_->failure();
  EXPECT_EQ(remote_->stats().link.protocol_errors, 1);
}

TEST_F(StepDeadlineTest, DigestFromTheFollowerIsAProtocolError) {
  Make({.digest_interval = absl::ZeroDuration()}, {});
  Probe();
  ASSERT_TRUE(peer_->link().Send(Digest{}).ok());
  ASSERT_TRUE(ProbeFailed());
  EXPECT_FALSE(peer_->WaitFailure().ok());
  EXPECT_NE(remote_->failure().message().find("a follower sent a digest"),
            std::string::npos)
      << remote_->failure();
}

TEST_F(StepDeadlineTest, MalformedDigestResultIsRefused) {
  Make({.digest_interval = absl::Milliseconds(10)}, {});
  ASSERT_TRUE(peer_->WaitCount(FrameKind::kDigest, 1));
  Probe();
  std::string bad = EncodeFrame(kEpoch, 1, DigestResult{.match = true});
  bad[kFrameHeaderBytes + 8] = 7;  // Match byte.
  ASSERT_TRUE(peer_->raw()->Send(bad).ok());
  ASSERT_TRUE(ProbeFailed());
  EXPECT_FALSE(peer_->WaitFailure().ok());
  const absl::Status failure = remote_->failure();
  // The protocol error or the link failure naming it (see above).
  EXPECT_THAT(failure.code(), ::testing::AnyOf(absl::StatusCode::kDataLoss,
                                               absl::StatusCode::kUnavailable));
  EXPECT_NE(failure.message().find("digest_result match 7"), std::string::npos)
      << failure;
  EXPECT_EQ(remote_->stats().digests_matched, 0);
}

// What GroupLeader relies on: the engine failing aborts the link, so the
// member's MemberHealth (heartbeats sent through the engine) declares it
// dead within an interval, long before its silence timeout.
TEST_F(StepDeadlineTest, DeadlineFailureIsADeathForTheMembersHealth) {
  Make({.step_timeout = absl::Milliseconds(200),
        .digest_interval = absl::ZeroDuration()},
       {});
  std::promise<absl::Status> dead;
  std::atomic<int> deaths{0};
  RemoteTransferEngine* remote = remote_.get();
  auto health = MemberHealth::Create(
      MemberHealthOptions{.peer = "follower 1",
                          .interval = absl::Milliseconds(20),
                          .timeout = absl::Seconds(60)},
      [remote](const FrameBody& body) { return remote->SendControl(body); },
      [&](const absl::Status& reason) {
        if (++deaths == 1) {
          dead.set_value(absl::Status(reason.code(),
                                      std::string(reason.message())));
        }
      });
  ASSERT_TRUE(health.ok()) << health.status();
  ASSERT_TRUE((*health)->Start().ok());
  ASSERT_TRUE(remote_->Submit(MakeTask(7, 1, {2})).ok());
  std::future<absl::Status> reason = dead.get_future();
  ASSERT_EQ(reason.wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  const absl::Status why = reason.get();
  EXPECT_EQ(why.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(why.message().find("did not answer op 7"), std::string::npos)
      << why;
  (*health)->Stop();
  EXPECT_EQ(deaths.load(), 1);
}

}  // namespace
}  // namespace hicache::group
