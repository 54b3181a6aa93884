// GroupLeader over in-process loopback links: a real HiCacheEngine on the
// leader side (pool_ranks = the leader's ranks; a RoutingTransferEngine
// installed through wrap_transfer) and GroupFollowers whose executors copy
// on a CpuTransferEngine over pools of their own. Forming, refusals, a
// byte-exact backup and load through the group, a member's death (lanes
// unavailable and dropped, loads miss, backups skip, no wrong byte),
// readmission with fresh pools, and a clean Stop.
#include "daemon/group/group_leader.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/group/group_follower.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_pool.h"
#include "gtest/gtest.h"
#include "tests/group/group_leader_rig.h"

namespace hicache::group {
namespace {

using testing::FollowerSide;
using testing::GroupLeaderTest;
using testing::kInterval;
using testing::kP;
using testing::kSlack;
using testing::kTimeout;
using testing::Seq;
using testing::Split;

TEST_P(GroupLeaderTest, FormsOnceTheFollowerIsAdmitted) {
  const Split& split = GetParam();
  GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kForming);
  EXPECT_EQ(status.role, GroupRole::kLeader);
  EXPECT_EQ(status.name, "g");
  ASSERT_EQ(status.members.size(), 1u);
  EXPECT_EQ(status.members[0].ranks, split.leader);
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);

  FollowerSide* f = NewFollower(split.follower);
  auto admission = Join(f, "f1", split.follower, nullptr);
  ASSERT_TRUE(admission.ok()) << admission.status();
  EXPECT_EQ(admission->member_index, 1u);
  EXPECT_EQ(admission->epoch, 1u);
  EXPECT_FALSE(admission->readmitted);
  status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  EXPECT_EQ(status.epoch, 1u);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.members[1].name, "f1");
  EXPECT_EQ(status.members[1].ranks, split.follower);
  EXPECT_TRUE(status.members[1].live);
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  EXPECT_EQ(f->follower->Status().state, GroupState::kFormed);
  EXPECT_STREQ(GroupStateName(status.state), "formed");
}

TEST_P(GroupLeaderTest, GeometryMismatchIsRefusedNamingTheField) {
  GroupGeometry bad = FollowerGeometry(GetParam().follower);
  bad.host_pages_per_rank += 1;
  auto [leader_link, follower_link] =
      comm::LoopbackCommunicator::CreatePair("leader", "f1");
  auto admission = leader_->Admit("f1", bad, std::move(leader_link));
  ASSERT_EQ(admission.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(admission.status().message().find("host_pages_per_rank"),
            std::string::npos)
      << admission.status();
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kForming);
  EXPECT_EQ(status.members.size(), 1u);
  EXPECT_EQ(status.epoch, 0u);
  EXPECT_EQ(engine_->UnavailableLanes(), GetParam().follower);
}

TEST_P(GroupLeaderTest, RanksOfALiveMemberOrTheLeaderAreRefused) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  ASSERT_TRUE(Join(f, "f1", split.follower, nullptr).ok());
  // The follower's last rank again: held by live member f1.
  const std::vector<Rank> again = {split.follower.back()};
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "f2");
  auto refused = leader_->Admit("f2", FollowerGeometry(again), std::move(l1));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("f1"), std::string::npos)
      << refused.status();
  // The leader's own rank.
  const std::vector<Rank> mine = {split.leader.front()};
  auto [l2, f2] = comm::LoopbackCommunicator::CreatePair("leader", "f3");
  refused = leader_->Admit("f3", FollowerGeometry(mine), std::move(l2));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("leader"), std::string::npos)
      << refused.status();
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  EXPECT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.epoch, 1u);
}

TEST_P(GroupLeaderTest, BackupAndLoadThroughTheGroupAreByteExact) {
  FollowerSide* f = NewFollower(GetParam().follower);
  ASSERT_TRUE(Join(f, "f1", GetParam().follower, nullptr).ok());
  const std::vector<int32_t> zig = Seq(0, kP * 2 * GetParam().cp_size);
  ASSERT_NO_FATAL_FAILURE(Cache(zig, Zigzag(), 3, f));
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(f);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(zig, 3, f));
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  EXPECT_GT(f->follower->executor_stats().steps_executed, 0);
  EXPECT_EQ(f->follower->executor_stats().steps_refused, 0);
  EXPECT_EQ(f->fatals.load(), 0);
  // Both ends' status carry the data path's counters.
  engine_->WaitForTransfers();
  const GroupStatus status = leader_->Status();
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_FALSE(status.members[0].has_transfer);  // The leader itself.
  EXPECT_FALSE(status.members[0].has_events);
  const GroupMemberStatus& m = status.members[1];
  ASSERT_TRUE(m.has_transfer);
  EXPECT_GT(m.transfer.steps_sent, 0);
  EXPECT_EQ(m.transfer.steps_completed, m.transfer.steps_sent);
  EXPECT_EQ(m.transfer.steps_failed, 0);
  EXPECT_EQ(m.transfer.outstanding, 0);
  EXPECT_EQ(m.transfer.step_timeouts, 0);
  EXPECT_EQ(m.transfer.digest_divergences, 0);
  EXPECT_GE(m.transfer.digests_matched, 0);
  EXPECT_TRUE(m.has_events);  // The rig forwards worker events.
  EXPECT_FALSE(m.events.failed);
  const GroupStatus fs = f->follower->Status();
  const FollowerExecutor::Stats e = f->follower->executor_stats();
  EXPECT_GT(fs.follower.tasks_received, 0);
  EXPECT_EQ(fs.follower.steps_executed, e.steps_executed);
  EXPECT_EQ(fs.follower.steps_executed, m.transfer.steps_completed);
  EXPECT_EQ(fs.follower.steps_refused, 0);
  EXPECT_EQ(fs.follower.steps_rejected, 0);
  EXPECT_FALSE(fs.follower.diverged);
  EXPECT_EQ(fs.follower.acks_relayed, 0);
  EXPECT_EQ(status.follower.tasks_received, 0);  // A leader has none.
  // Frozen, not zeroed, once the follower stopped.
  f->follower->Stop();
  EXPECT_EQ(f->follower->Status().follower.steps_executed, e.steps_executed);
}

// The follower's link breaks while copies are in flight: the leader declares
// it dead within the bound, once; its lanes are unavailable and dropped
// (loads miss, backups skip, nothing on them is matched); the follower is
// told once. A restarted follower (fresh pools) is readmitted in the same
// slot and the group serves again, byte-exact.
TEST_P(GroupLeaderTest, DeathMidTrafficThenReadmission) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(f, "f1", split.follower, &link).ok());
  const std::vector<int32_t> zig = Seq(0, kP * 2 * split.cp_size);
  const std::vector<int32_t> mine = Seq(1000, kP * 2);
  ASSERT_NO_FATAL_FAILURE(Cache(zig, Zigzag(), 5, f));
  ASSERT_NO_FATAL_FAILURE(Cache(mine, LeaderOnly(2), 6, f));
  ASSERT_EQ(engine_->Stats().backups_committed, 2);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());  // Both host-only now.

  // Backups in flight when the link breaks.
  auto pages = engine_->AllocateWithOwners(Zigzag());
  ASSERT_TRUE(pages.ok());
  WritePages(*pages, 7, f);
  auto ops = engine_->PrepareBackups(
      {BackupSpec{*pages, static_cast<int64_t>(pages->size() * kP)}});
  ASSERT_TRUE(ops.ok());
  ASSERT_TRUE(engine_->LayerStored(*ops, 0).ok());
  auto first_death = first_death_.get_future();
  const auto broke = std::chrono::steady_clock::now();
  link->Break(absl::UnavailableError("the follower's host went away"));
  for (uint32_t s = 1; s < engine_->geometry().NumSteps(); ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  ASSERT_EQ(first_death.wait_for(
                absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack)),
            std::future_status::ready);
  const absl::Duration took =
      absl::FromChrono(std::chrono::steady_clock::now() - broke);
  const std::string reason = first_death.get();
  std::printf("member declared dead %s after the break: %s\n",
              absl::FormatDuration(took).c_str(), reason.c_str());
  EXPECT_NE(reason.find("f1"), std::string::npos) << reason;
  EXPECT_NE(reason.find("lost"), std::string::npos) << reason;
  // The follower lost its leader, once.
  ASSERT_EQ(f->fatal_future.wait_for(
                absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack)),
            std::future_status::ready);
  const absl::Status fatal = f->fatal_future.get();
  EXPECT_EQ(fatal.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fatal.message().find("CP group g leader leader lost"),
            std::string::npos)
      << fatal;
  EXPECT_EQ(f->follower->Status().state, GroupState::kDegraded);

  leader_->AwaitDeathsHandled();
  engine_->WaitForTransfers();
  EXPECT_EQ(deaths_.load(), 1);
  GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  EXPECT_EQ(status.deaths, 1);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_FALSE(status.members[1].live);
  EXPECT_NE(status.members[1].reason.find("f1"), std::string::npos);
  {
    // The dead member's counters, frozen at its retirement: every step sent
    // either completed or failed by the death. (A broken link is a death at
    // once, so whether the later steps were still sent to it, and failed,
    // depends on when the leader heard of the break.)
    const GroupMemberTransfer& t = status.members[1].transfer;
    ASSERT_TRUE(status.members[1].has_transfer);
    EXPECT_GT(t.steps_sent, 0);
    EXPECT_EQ(t.outstanding, 0);
    EXPECT_EQ(t.steps_completed + t.steps_failed, t.steps_sent);
    EXPECT_EQ(t.digest_divergences, 0);
    EXPECT_TRUE(status.members[1].has_events);
  }
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  EXPECT_GE(engine_->Stats().lane_drops, 1);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  // The zigzag node had pages on the dead lanes: gone.
  EXPECT_EQ(engine_->Match("", zig, /*peek=*/true)->host_hit_len, 0);
  // A load is a miss, a backup is skipped.
  EngineStats before = engine_->Stats();
  auto load = engine_->LoadBack("", mine);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->op_id, 0u);
  EXPECT_EQ(load->miss, LoadMissReason::kLaneUnavailable);
  if (load->node != kNoNode) {
    ASSERT_TRUE(engine_->Unlock(load->node).ok());
  }
  auto spare = engine_->AllocateWithOwners(LeaderOnly(1));
  ASSERT_TRUE(spare.ok());
  auto skipped = engine_->PrepareBackups({BackupSpec{*spare, kP}});
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ((*skipped)[0], 0u);
  ASSERT_TRUE(engine_->Free(*spare).ok());
  ASSERT_TRUE(engine_->Free(*pages).ok());
  EngineStats after = engine_->Stats();
  EXPECT_EQ(after.load_misses_lane_unavailable,
            before.load_misses_lane_unavailable + 1);
  EXPECT_GT(after.backups_skipped_lane_unavailable,
            before.backups_skipped_lane_unavailable);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();

  // The follower restarts with fresh pools and rejoins.
  f->follower->Stop();
  FollowerSide* g = NewFollower(split.follower);
  auto again = Join(g, "f1-restarted", split.follower, nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->readmitted);
  EXPECT_EQ(again->member_index, 1u);
  EXPECT_EQ(again->epoch, 2u);
  status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_TRUE(status.members[1].live);
  EXPECT_EQ(status.members[1].readmissions, 1);
  EXPECT_EQ(status.members[1].name, "f1-restarted");
  // A new engine: its counters start again.
  EXPECT_EQ(status.members[1].transfer.steps_failed, 0);
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  // The leader-only node survived (its host copy is on the leader) and loads
  // back byte-exact through the new follower (which acks its empty copies);
  // a new zigzag key round-trips.
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(g);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(mine, 6, g));
  const std::vector<int32_t> zig2 = Seq(5000, kP * 2 * split.cp_size);
  ASSERT_NO_FATAL_FAILURE(Cache(zig2, Zigzag(), 8, g));
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(g);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(zig2, 8, g));
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  EXPECT_EQ(deaths_.load(), 1);
  EXPECT_EQ(f->fatals.load(), 1);
  EXPECT_EQ(g->fatals.load(), 0);
}

// A member whose ranks overlap a dead member's only in part is refused;
// exactly the dead member's ranks are readmitted.
TEST_P(GroupLeaderTest, PartialOverlapWithADeadMemberIsRefused) {
  const Split& split = GetParam();
  if (split.follower.size() < 2) GTEST_SKIP() << "needs a 2-rank follower";
  FollowerSide* f = NewFollower(split.follower);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(f, "f1", split.follower, &link).ok());
  auto death = first_death_.get_future();
  link->Break(absl::UnavailableError("gone"));
  ASSERT_EQ(death.wait_for(absl::ToChronoMilliseconds(kTimeout + kSlack)),
            std::future_status::ready);
  const std::vector<Rank> part = {split.follower.front()};
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "f2");
  auto refused = leader_->Admit("f2", FollowerGeometry(part), std::move(l1));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dead member"), std::string::npos)
      << refused.status();
  EXPECT_EQ(leader_->Status().state, GroupState::kDegraded);
}

// A hostile name never puts a newline in a message or a reason.
TEST_P(GroupLeaderTest, MemberNamesAreEscaped) {
  const Split& split = GetParam();
  const std::string evil = "f1\nFATAL forged";
  FollowerSide* f = NewFollower(split.follower);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(f, evil, split.follower, &link).ok());
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "x");
  auto refused =
      leader_->Admit("x", FollowerGeometry(split.follower), std::move(l1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().find('\n'), std::string::npos)
      << refused.status();
  auto death = first_death_.get_future();
  link->Break(absl::UnavailableError("gone"));
  ASSERT_EQ(death.wait_for(absl::ToChronoMilliseconds(kTimeout + kSlack)),
            std::future_status::ready);
  const std::string reason = death.get();
  EXPECT_EQ(reason.find('\n'), std::string::npos) << reason;
  EXPECT_NE(reason.find("f1\\nFATAL forged"), std::string::npos) << reason;
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(leader_->Status().members[1].reason.find('\n'), std::string::npos);
}

// Every way of losing a member is one death that drops its lanes: a
// follower that never answers (silence, not before the timeout), one that
// sends garbage (a protocol error), one that says Bye (its Stop). Each time
// a restarted follower is readmitted.
TEST_P(GroupLeaderTest, EveryWayOfLosingAMemberIsOneDeath) {
  const Split& split = GetParam();
  // Silence: admitted, but the follower's end never starts.
  auto [l1, silent] = comm::LoopbackCommunicator::CreatePair("leader", "f");
  const auto admitted = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      leader_->Admit("silent", FollowerGeometry(split.follower), std::move(l1))
          .ok());
  std::string reason = AwaitDeath(1);
  const absl::Duration took =
      absl::FromChrono(std::chrono::steady_clock::now() - admitted);
  EXPECT_NE(reason.find("nothing heard"), std::string::npos) << reason;
  EXPECT_GE(took, kTimeout);
  EXPECT_LE(took, kTimeout + kInterval + kSlack);
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);

  // A protocol error.
  auto [l2, raw] = comm::LoopbackCommunicator::CreatePair("leader", "f");
  comm::LoopbackCommunicator* garbage = raw.get();
  auto second = leader_->Admit("garbled", FollowerGeometry(split.follower),
                               std::move(l2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->readmitted);
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  ASSERT_TRUE(
      raw->Start([](absl::string_view) {}, [](const absl::Status&) {}).ok());
  ASSERT_TRUE(garbage->Send("not a frame").ok());
  reason = AwaitDeath(2);
  EXPECT_NE(reason.find("protocol error"), std::string::npos) << reason;
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);

  // Bye: the follower stops.
  FollowerSide* f = NewFollower(split.follower);
  auto third = Join(f, "polite", split.follower, nullptr);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->epoch, 3u);
  EXPECT_EQ(leader_->Status().state, GroupState::kFormed);
  f->follower->Stop();
  reason = AwaitDeath(3);
  EXPECT_NE(reason.find("said bye"), std::string::npos) << reason;
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  EXPECT_EQ(status.deaths, 3);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.members[1].readmissions, 2);
  EXPECT_EQ(deaths_.load(), 3);
  EXPECT_EQ(f->fatals.load(), 0);  // Its own Stop is no loss.
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

// The rendezvous failing is returned as is and changes nothing but the
// epoch.
TEST_P(GroupLeaderTest, ConnectFailureChangesNothing) {
  const Split& split = GetParam();
  auto admission = leader_->Admit(
      "f1", FollowerGeometry(split.follower),
      [](const Admission& a)
          -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous of epoch ", a.epoch, " timed out"));
      });
  EXPECT_EQ(admission.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(admission.status().message(), "rendezvous of epoch 1 timed out");
  GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kForming);
  EXPECT_EQ(status.members.size(), 1u);
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  FollowerSide* f = NewFollower(split.follower);
  auto joined = Join(f, "f1", split.follower, nullptr);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->epoch, 2u);
  EXPECT_EQ(joined->member_index, 1u);
  EXPECT_EQ(leader_->Status().state, GroupState::kFormed);
}

// A death is handled while another admission waits in its rendezvous.
TEST_P(GroupLeaderTest, DeathIsHandledDuringAnotherAdmissionsConnect) {
  const Split& split = GetParam();
  if (split.follower.size() < 2) GTEST_SKIP() << "needs two follower ranks";
  const std::vector<Rank> first = {split.follower[0]};
  const std::vector<Rank> second = {split.follower[1]};
  FollowerSide* a = NewFollower(first);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(a, "a", first, &link).ok());
  EXPECT_EQ(leader_->Status().state, GroupState::kForming);
  auto death = first_death_.get_future();
  FollowerSide* b = NewFollower(second);
  auto [leader_end, follower_end] =
      comm::LoopbackCommunicator::CreatePair("leader", "b");
  auto admission = leader_->Admit(
      "b", FollowerGeometry(second),
      [&](const Admission&)
          -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
        link->Break(absl::UnavailableError("a went away"));
        if (death.wait_for(absl::ToChronoMilliseconds(kTimeout + kSlack)) !=
            std::future_status::ready) {
          return absl::DeadlineExceededError("the death was not handled");
        }
        return std::move(leader_end);
      });
  ASSERT_TRUE(admission.ok()) << admission.status();
  ASSERT_TRUE(b->follower
                  ->Run(std::move(follower_end), admission->epoch,
                        admission->member_index)
                  .ok());
  EXPECT_EQ(admission->member_index, 2u);
  EXPECT_EQ(engine_->UnavailableLanes(), first);
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  ASSERT_EQ(status.members.size(), 3u);
  EXPECT_FALSE(status.members[1].live);
  EXPECT_TRUE(status.members[2].live);
  EXPECT_EQ(deaths_.load(), 1);
}

TEST_P(GroupLeaderTest, StopWithCopiesInFlightIsClean) {
  FollowerSide* f = NewFollower(GetParam().follower);
  ASSERT_TRUE(Join(f, "f1", GetParam().follower, nullptr).ok());
  auto pages = engine_->AllocateWithOwners(Zigzag());
  ASSERT_TRUE(pages.ok());
  auto ops = engine_->PrepareBackups(
      {BackupSpec{*pages, static_cast<int64_t>(pages->size() * kP)}});
  ASSERT_TRUE(ops.ok());
  for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  leader_->Stop();
  leader_->Stop();  // Idempotent.
  EXPECT_EQ(leader_->Status().state, GroupState::kStopped);
  EXPECT_EQ(engine_->UnavailableLanes(), GetParam().follower);
  engine_->WaitForTransfers();
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  ASSERT_TRUE(engine_->Free(*pages).ok());
  // The follower hears of it (Bye or the closed link), once.
  ASSERT_EQ(f->fatal_future.wait_for(
                absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack)),
            std::future_status::ready);
  EXPECT_EQ(f->fatal_future.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(f->fatals.load(), 1);
  // A stopped leader admits no one; Stop is not a death.
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "f2");
  EXPECT_EQ(
      leader_->Admit("f2", FollowerGeometry(GetParam().follower), std::move(l1))
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(deaths_.load(), 0);
}

// Heartbeats an hour apart and silence of two hours on both ends: within
// a test, a member can only be declared dead through its link's failure
// (its RemoteTransferEngine's on_failure -> MemberHealth::LinkFailed).
class GroupLeaderLinkFailureTest : public GroupLeaderTest {
 protected:
  GroupLeaderLinkFailureTest() {
    heartbeat_interval_ = absl::Hours(1);
    heartbeat_timeout_ = absl::Hours(2);
  }
};

// Only against a hang: far below the heartbeat interval, and what it waits
// for takes milliseconds.
constexpr absl::Duration kHangGuard = absl::Seconds(60);

// A broken link is a death at once, not at the next heartbeat round: once
// the leader's first heartbeat reached the follower (its next is an hour
// away), the link breaks and the member is declared dead naming the link's
// cause, its lanes dropped, the follower told, each once.
TEST_P(GroupLeaderLinkFailureTest, ABrokenLinkIsADeathAtOnce) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  auto [leader_link, follower_link] =
      comm::LoopbackCommunicator::CreatePair("leader", "follower link");
  comm::LoopbackCommunicator* link = leader_link.get();
  // The leader's first heartbeat (sent as its health starts), seen as the
  // follower's end delivers it. Shared: the hook lives as long as the link.
  struct Seen {
    std::atomic<bool> heartbeat{false};
    std::promise<void> first;
  };
  auto seen = std::make_shared<Seen>();
  std::future<void> first_heartbeat = seen->first.get_future();
  follower_link->SetDeliveryHook([seen](absl::string_view bytes) {
    absl::StatusOr<Frame> frame = DecodeFrame(bytes);
    if (frame.ok() && frame->header.kind == FrameKind::kHeartbeat &&
        !seen->heartbeat.exchange(true)) {
      seen->first.set_value();
    }
    return absl::OkStatus();
  });
  auto admission = leader_->Admit("f1", FollowerGeometry(split.follower),
                                  std::move(leader_link));
  ASSERT_TRUE(admission.ok()) << admission.status();
  ASSERT_TRUE(f->follower
                  ->Run(std::move(follower_link), admission->epoch,
                        admission->member_index)
                  .ok());
  ASSERT_EQ(first_heartbeat.wait_for(absl::ToChronoMilliseconds(kHangGuard)),
            std::future_status::ready);
  ASSERT_EQ(leader_->Status().state, GroupState::kFormed);

  auto first_death = first_death_.get_future();
  link->Break(absl::UnavailableError("cable cut"));
  ASSERT_EQ(first_death.wait_for(absl::ToChronoMilliseconds(kHangGuard)),
            std::future_status::ready)
      << "a broken link was not a death before the next heartbeat";
  const std::string reason = first_death.get();
  EXPECT_NE(reason.find("f1"), std::string::npos) << reason;
  EXPECT_NE(reason.find("link failed"), std::string::npos) << reason;
  EXPECT_NE(reason.find("cable cut"), std::string::npos) << reason;
  EXPECT_EQ(reason.find("heartbeat could not be sent"), std::string::npos)
      << reason;
  ASSERT_EQ(f->fatal_future.wait_for(absl::ToChronoMilliseconds(kHangGuard)),
            std::future_status::ready);
  const absl::Status fatal = f->fatal_future.get();
  EXPECT_EQ(fatal.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fatal.message().find("cable cut"), std::string::npos) << fatal;

  leader_->AwaitDeathsHandled();
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  EXPECT_EQ(status.deaths, 1);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_FALSE(status.members[1].live);
  EXPECT_NE(status.members[1].reason.find("link failed"), std::string::npos)
      << status.members[1].reason;
  // The heartbeat at its start, and no round after it.
  EXPECT_EQ(status.members[1].heartbeats_sent, 1);
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  EXPECT_EQ(deaths_.load(), 1);
  EXPECT_EQ(f->fatals.load(), 1);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

std::string SplitName(const ::testing::TestParamInfo<Split>& info) {
  return absl::StrCat("C", info.param.cp_size, "_leader",
                      info.param.leader.size(), "_follower",
                      info.param.follower.size());
}

INSTANTIATE_TEST_SUITE_P(Splits, GroupLeaderTest,
                         ::testing::Values(Split{2, {0}, {1}},
                                           Split{4, {0, 1}, {2, 3}}),
                         SplitName);
INSTANTIATE_TEST_SUITE_P(Splits, GroupLeaderLinkFailureTest,
                         ::testing::Values(Split{2, {0}, {1}},
                                           Split{4, {0, 1}, {2, 3}}),
                         SplitName);

}  // namespace
}  // namespace hicache::group
