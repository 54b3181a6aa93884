// Worker events and acks across a CP group link (docs/cp-groups.md, "Worker
// events and acks across the link"), over the group_leader_rig: a real
// leader engine whose EventHub taps into an EventForwarder, and follower
// daemons whose GroupFollower applies the leader's events to their own
// EventHub. A follower-side subscriber of rank r gets backup_step /
// backup_ended / layer_loaded / load_ended for a backup and a load the
// leader runs; a follower-relayed layer_stored (SessionManager::
// NamespaceLayerStored on the leader) submits that rank's step, and the
// backup commits once every rank acked; refusals change nothing.
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/core/clock.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/engine/session_manager.h"
#include "daemon/group/wire_link.h"
#include "gtest/gtest.h"
#include "tests/group/group_leader_rig.h"

namespace hicache::group {
namespace {

using testing::FollowerSide;
using testing::GroupLeaderTest;
using testing::kP;
using testing::kSlack;
using testing::Seq;
using testing::Split;

class WorkerEventsLinkTest : public GroupLeaderTest {
 protected:
  void SetUp() override {
    GroupLeaderTest::SetUp();
    if (HasFatalFailure()) return;
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1));
    // What the daemon wires: a relayed ack is what a local worker session
    // of that namespace may store.
    layer_stored_ = [this](const std::string& ns, Rank rank, uint32_t step,
                           absl::Span<const uint64_t> ops) {
      ++handled_;
      return sessions_->NamespaceLayerStored(ns, rank, ops, step);
    };
    auto info = sessions_->Open("scheduler", SessionRole::kScheduler, 0, "ns",
                                absl::Minutes(1));
    ASSERT_TRUE(info.ok()) << info.status();
    scheduler_ = info->id;
  }
  void TearDown() override {
    leader_.reset();  // Its link threads call sessions_.
    sessions_.reset();
    GroupLeaderTest::TearDown();
  }

  std::shared_ptr<EventMailbox> Subscribe(FollowerSide* f, Rank rank,
                                          const std::string& ns) {
    auto box = std::make_shared<EventMailbox>(4096, [] {});
    f->hub.Subscribe(rank, ns, box);
    return box;
  }
  // The next event of `box` (they come over the link); nullopt if none came.
  static std::optional<OpEvent> Next(EventMailbox& box) {
    return box.Wait(absl::Now() + kSlack);
  }

  uint32_t Steps() const { return engine_->geometry().NumSteps(); }

  RealClock clock_;
  std::unique_ptr<SessionManager> sessions_;
  std::string scheduler_;
  std::atomic<int> handled_{0};
};

TEST_P(WorkerEventsLinkTest, FollowerWorkersSeeTheLeadersBackupAndLoad) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  ASSERT_TRUE(Join(f, "f1", split.follower, nullptr).ok());
  std::vector<std::shared_ptr<EventMailbox>> boxes;
  for (Rank r : split.follower) boxes.push_back(Subscribe(f, r, "ns"));
  // A subscriber of a leader rank on the follower gets outcomes only; one
  // of another namespace gets nothing.
  auto leader_rank_box = Subscribe(f, split.leader.front(), "ns");
  auto other_ns_box = Subscribe(f, split.follower.front(), "other");

  // The scheduler's backup, tagged for its namespace as its stream does.
  const std::vector<int32_t> tokens = Seq(0, kP * 2 * split.cp_size);
  auto pages =
      sessions_->Allocate(scheduler_, {AllocationItem{.owners = Zigzag()}});
  ASSERT_TRUE(pages.ok()) << pages.status();
  WritePages(pages->front(), 5, f);
  auto ids = sessions_->PrepareBackups(
      scheduler_,
      {BackupSpec{pages->front(), static_cast<int64_t>(tokens.size())}});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t op = ids->front();
  ASSERT_NE(op, 0u);
  hub_.Tag(op, "ns");
  // The leader's own workers ack every layer.
  for (uint32_t s = 0; s < Steps(); ++s) {
    for (Rank r : split.leader) {
      ASSERT_TRUE(sessions_->NamespaceLayerStored("ns", r, {op}, s).ok());
    }
  }
  auto inserted = sessions_->Insert(
      scheduler_, {SessionInsertItem{.tokens = tokens,
                                     .pages = pages->front(),
                                     .backup_id = op}});
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  ASSERT_TRUE(inserted->front().backup_attached);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 0)
      << "committed before the follower's workers acked";

  // Refusals change nothing: a rank this follower does not hold (refused
  // locally), another namespace, an unknown op (refused by the leader).
  const Rank fr = split.follower.front();
  EXPECT_EQ(f->follower->ForwardLayerStored("ns", split.leader.front(), 0, {op})
                .code(),
            absl::StatusCode::kInvalidArgument);
  const int handled_before = handled_.load();
  absl::Status other = f->follower->ForwardLayerStored("other", fr, 0, {op});
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_NE(other.message().find("namespace"), std::string::npos) << other;
  EXPECT_EQ(f->follower->ForwardLayerStored("ns", fr, 0, {op + 1000}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(handled_.load(), handled_before + 2);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 0);

  // The follower's workers ack through the link: each submits its rank's
  // step; the backup commits once every rank acked.
  for (uint32_t s = 0; s < Steps(); ++s) {
    for (Rank r : split.follower) {
      absl::Status acked = f->follower->ForwardLayerStored("ns", r, s, {op});
      ASSERT_TRUE(acked.ok()) << acked;
    }
  }
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  // Every relayed ack counted (the local refusal of a foreign rank in
  // neither); the two the leader refused as failed.
  const GroupFollowerCounters acks = f->follower->Status().follower;
  EXPECT_EQ(acks.acks_relayed,
            2 + static_cast<int64_t>(Steps() * split.follower.size()));
  EXPECT_EQ(acks.acks_failed, 2);

  for (size_t i = 0; i < boxes.size(); ++i) {
    std::vector<uint32_t> steps;
    for (uint32_t s = 0; s < Steps(); ++s) {
      std::optional<OpEvent> e = Next(*boxes[i]);
      ASSERT_TRUE(e.has_value()) << "rank " << split.follower[i];
      EXPECT_EQ(e->type, OpEvent::Type::kBackupStep);
      EXPECT_EQ(e->op, op);
      EXPECT_EQ(e->rank, split.follower[i]);
      steps.push_back(e->step);
    }
    std::sort(steps.begin(), steps.end());
    for (uint32_t s = 0; s < Steps(); ++s) EXPECT_EQ(steps[s], s);
    std::optional<OpEvent> ended = Next(*boxes[i]);
    ASSERT_TRUE(ended.has_value());
    EXPECT_EQ(ended->type, OpEvent::Type::kCommitted);
    EXPECT_EQ(ended->op, op);
  }

  // A load the leader runs: each follower rank's worker sees its layers
  // land, then the outcome.
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(f);
  auto load = engine_->LoadBack("ns", tokens);
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_NE(load->op_id, 0u) << "miss " << static_cast<int>(load->miss);
  hub_.Tag(load->op_id, "ns");  // As the scheduler's load stream does.
  engine_->WaitForTransfers();
  auto done = engine_->LoadDone(load->op_id);
  ASSERT_TRUE(done.ok() && *done);
  EXPECT_TRUE(VerifyPages(load->pages, 5, f).ok());
  for (size_t i = 0; i < boxes.size(); ++i) {
    for (uint32_t s = 0; s < Steps(); ++s) {
      std::optional<OpEvent> e = Next(*boxes[i]);
      ASSERT_TRUE(e.has_value());
      EXPECT_EQ(e->type, OpEvent::Type::kLoadStep);
      EXPECT_EQ(e->op, load->op_id);
      EXPECT_EQ(e->rank, split.follower[i]);
      EXPECT_EQ(e->fence, "");  // The CPU backend has none.
    }
    std::optional<OpEvent> ended = Next(*boxes[i]);
    ASSERT_TRUE(ended.has_value());
    EXPECT_EQ(ended->type, OpEvent::Type::kLoadDone);
    EXPECT_TRUE(ended->ok);
  }
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  // Outcomes only for the leader's rank; nothing for another namespace
  // (everything for "ns" arrived above, in the same order).
  std::optional<OpEvent> first = Next(*leader_rank_box);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->type, OpEvent::Type::kCommitted);
  std::optional<OpEvent> second = Next(*leader_rank_box);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->type, OpEvent::Type::kLoadDone);
  EXPECT_FALSE(leader_rank_box->Wait(absl::Now()).has_value());
  EXPECT_FALSE(other_ns_box->Wait(absl::Now()).has_value());
  EXPECT_EQ(f->fatals.load(), 0);
  EXPECT_GT(forwarder_.stats().frames_sent, 0);
}

// A member that bypasses its follower's checks: the leader refuses a rank
// it does not hold and an oversized op list, without calling the handler;
// a frame of the wrong direction is a protocol error, hence a death.
TEST_P(WorkerEventsLinkTest, LeaderRefusesWhatTheMemberMayNotAck) {
  const Split& split = GetParam();
  auto [leader_link, member_link] =
      comm::LoopbackCommunicator::CreatePair("leader", "member");
  absl::StatusOr<Admission> admission = leader_->Admit(
      "raw", FollowerGeometry(split.follower), std::move(leader_link));
  ASSERT_TRUE(admission.ok()) << admission.status();
  std::mutex mu;
  std::condition_variable cv;
  std::vector<LayerStoredAck> acks;
  WireLink link(std::move(member_link), admission->epoch);
  ASSERT_TRUE(link.Start(
                      [&](Frame frame) {
                        if (auto* ack = std::get_if<LayerStoredAck>(&frame.body)) {
                          std::lock_guard<std::mutex> lock(mu);
                          acks.push_back(LayerStoredAck{
                              ack->request_id,
                              absl::Status(ack->status.code(),
                                           std::string(ack->status.message()))});
                          cv.notify_all();
                        }
                        return absl::OkStatus();
                      },
                      [](const absl::Status&) {})
                  .ok());
  ASSERT_TRUE(link.Send(Heartbeat{.member_index = admission->member_index}).ok());
  ASSERT_TRUE(link.Send(LayerStoredRequest{.request_id = 1,
                                           .ns = "ns",
                                           .rank = split.leader.front(),
                                           .ops = {1}})
                  .ok());
  ASSERT_TRUE(link.Send(LayerStoredRequest{
                            .request_id = 2,
                            .ns = "ns",
                            .rank = split.follower.front(),
                            .ops = std::vector<uint64_t>(kMaxLayerStoredOps + 1,
                                                         1)})
                  .ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, absl::ToChronoMilliseconds(kSlack),
                            [&] { return acks.size() >= 2; }));
    EXPECT_EQ(acks[0].request_id, 1u);
    EXPECT_EQ(acks[0].status.code(), absl::StatusCode::kPermissionDenied)
        << acks[0].status;
    EXPECT_EQ(acks[1].request_id, 2u);
    EXPECT_EQ(acks[1].status.code(), absl::StatusCode::kInvalidArgument)
        << acks[1].status;
  }
  EXPECT_EQ(handled_.load(), 0);
  // Worker events from a member: the wrong direction, a protocol error.
  ASSERT_TRUE(link.Send(WorkerEventBatch{}).ok());
  const std::string death = AwaitDeath(1);
  EXPECT_NE(death.find("raw"), std::string::npos) << death;
}

TEST_P(WorkerEventsLinkTest, NoLeaderNoAck) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  const Rank fr = split.follower.front();
  // Not joined yet.
  absl::Status early = f->follower->ForwardLayerStored("ns", fr, 0, {1});
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable) << early;
  comm::LoopbackCommunicator* leader_end = nullptr;
  ASSERT_TRUE(Join(f, "f1", split.follower, &leader_end).ok());
  // Joined: an unknown op is the leader's answer, not a local one.
  EXPECT_EQ(f->follower->ForwardLayerStored("ns", fr, 0, {12345}).code(),
            absl::StatusCode::kInvalidArgument);
  leader_end->Break(absl::UnavailableError("cable pulled"));
  ASSERT_EQ(f->fatal_future.wait_for(absl::ToChronoMilliseconds(kSlack)),
            std::future_status::ready);
  absl::Status lost = f->follower->ForwardLayerStored("ns", fr, 0, {1});
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_NE(lost.message().find("lost"), std::string::npos) << lost;
  // Too many ops: refused locally, whatever the leader's state.
  EXPECT_EQ(f->follower
                ->ForwardLayerStored(
                    "ns", fr, 0, std::vector<uint64_t>(kMaxLayerStoredOps + 1))
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Before the join and after the loss: failed, not relayed; the leader's
  // refusal: relayed and failed; the local refusal: neither.
  const GroupFollowerCounters acks = f->follower->Status().follower;
  EXPECT_EQ(acks.acks_relayed, 1);
  EXPECT_EQ(acks.acks_failed, 3);
}

INSTANTIATE_TEST_SUITE_P(Splits, WorkerEventsLinkTest,
                         ::testing::Values(Split{2, {0}, {1}},
                                           Split{4, {0, 1}, {2, 3}}),
                         [](const ::testing::TestParamInfo<Split>& info) {
                           return absl::StrCat("C", info.param.cp_size,
                                               "_follower",
                                               info.param.follower.size());
                         });

}  // namespace
}  // namespace hicache::group
