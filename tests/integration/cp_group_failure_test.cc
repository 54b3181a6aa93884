// CP groups across daemons with real processes (issue 13, docs/cp-groups.md):
// failures. The scheduler (this test) on the leader and kv_agent workers per
// rank, as in cp_group_integrity_test.cc.
//
// - A follower SIGKILLed mid-backup and mid-load (held stopped with SIGSTOP
//   first, so that its copies are certainly outstanding), then once more
//   with a load racing the kill: no wrong byte, the backup never commits,
//   the leader degraded with the member dead and a reason, tree RPCs still
//   answered, loads miss with lane_unavailable, backups skip, hicachectl
//   shows the group; restarted with the same ranks it is readmitted, the
//   group formed, and a new round trip is byte-exact on every rank.
// - Detection and recovery times over several kill/restart rounds.
// - The leader SIGKILLed: every follower exits non-zero within a bound,
//   with a log line saying it lost the leader.
//
// The detection and recovery times seen are printed and recorded as test
// properties (follower_kill_to_degraded_ms, follower_restart_to_formed_ms,
// leader_kill_to_follower_exit_ms).
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/cp_group_fixture.h"
#include "tests/integration/cp_group_test_base.h"
#include "tests/testing/binaries.h"

namespace hicache::cp_group_testing {
namespace {

// --- A follower dies --------------------------------------------------------

TEST_F(CpGroupTest, FollowerKilledMidBackupAndMidLoadThenReadmitted) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0, 1}, {2, 3}})));
  const std::vector<uint32_t> leader_ranks = RanksOf(0);

  // A request whose pages all live on the leader's lanes, and one spread
  // over every lane; both committed and moved to the host tier.
  const Key local = WriteAndCommit(1000, 4, 11, {0, 1, 0, 1});
  const Key spread = WriteAndCommit(20000, 8, 12);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());

  // Mid-backup: the follower is held stopped, so its copies of the layers
  // stored from now on stay outstanding.
  Key doomed{Tokens(30000, 8 * page_size()), {}, 13};
  doomed.pages = Allocate(8);
  ASSERT_NO_FATAL_FAILURE(RunWorkers("write", doomed.pages, doomed.seed));
  const uint64_t backup = Prepare(doomed);
  ASSERT_NE(backup, 0u);
  ASSERT_NO_FATAL_FAILURE(StoreLayers(backup, 0, 1));
  ASSERT_TRUE(group_->Signal(1, SIGSTOP).ok());
  ASSERT_NO_FATAL_FAILURE(StoreLayers(backup, 1, layout_.num_steps()));
  Insert(doomed, backup);

  // Mid-load: the leader's ranks load, the follower's cannot.
  v1::LoadBackRequest load_request;
  load_request.set_tokens(client::PackTokens(spread.tokens));
  auto load = session_->StartLoadBack(load_request);
  ASSERT_TRUE(load.ok()) << load.status();
  v1::LoadBackEvent event;
  ASSERT_TRUE((*load)->Next(&event));
  ASSERT_TRUE(event.has_started()) << event.ShortDebugString();
  const v1::LoadBackEvent::Started started = event.started();
  EXPECT_NE(started.load_id(), 0u) << started.ShortDebugString();

  const absl::Time killed = absl::Now();
  ASSERT_TRUE(group_->Kill(1).ok());
  auto degraded = group_->WaitForState(0, "degraded", absl::Seconds(20));
  ASSERT_TRUE(degraded.ok()) << degraded.status() << group_->DescribeLogs();
  const absl::Duration detect = absl::Now() - killed;

  // The load ends, failed (a miss), or byte-exact on the ranks that live.
  bool load_ok = false;
  while ((*load)->Next(&event)) {
    if (event.has_done()) load_ok = event.done().ok();
  }
  EXPECT_TRUE((*load)->Finish().ok());
  if (load_ok) {
    const auto& proto = started.locations().pages();
    ASSERT_NO_FATAL_FAILURE(
        RunWorkers("verify", std::vector<int64_t>(proto.begin(), proto.end()),
                   spread.seed, leader_ranks));
  }
  // The backup never commits: it is rolled back.
  auto committed = backups_->WaitCommitted(backup);
  EXPECT_FALSE(committed.ok()) << "a backup with a dead rank committed";
  EXPECT_TRUE(backups_->Progress(backup).rolled_back);

  // The leader, consistent and degraded.
  {
    const v1::CpGroupStatus& g = *degraded;
    EXPECT_EQ(g.role(), "leader");
    EXPECT_GE(g.deaths(), 1);
    ASSERT_EQ(g.members_size(), 2) << g.ShortDebugString();
    EXPECT_EQ(g.members(0).health(), "live");
    EXPECT_EQ(g.members(1).name(), group_->member_name(1));
    EXPECT_EQ(g.members(1).health(), "dead");
    EXPECT_FALSE(g.members(1).reason().empty()) << g.ShortDebugString();
    std::printf("[cp_group] follower death as the leader reports it: %s\n",
                g.members(1).reason().c_str());
  }
  // Tree RPCs still answer. Everything with a page on the dead lanes is
  // gone; the leader-only request is still a host hit but cannot load
  // while a lane is down.
  //
  // The leader reports the member dead (and the group degraded) at once,
  // and drops its lanes a moment later on its own thread
  // (docs/cp-groups.md, GroupLeader "Death"): until then a match can still
  // return pages on the dead lanes. Wait (bounded) for the drop, and say
  // how long the window was.
  {
    const absl::Time since = absl::Now();
    const absl::Time deadline = since + absl::Seconds(10);
    while (absl::Now() < deadline &&
           (Peek(spread.tokens).host_hit_tokens() != 0 ||
            Peek(doomed.tokens).device().pages_size() != 0)) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    std::printf(
        "[cp_group] lanes dropped %.1f ms after the leader first reported "
        "'degraded' (0: already dropped)\n",
        Ms(absl::Now() - since));
  }
  EXPECT_EQ(Peek(spread.tokens).host_hit_tokens(), 0);
  EXPECT_EQ(Peek(spread.tokens).device().pages_size(), 0);
  EXPECT_EQ(Peek(doomed.tokens).host_hit_tokens(), 0);
  EXPECT_EQ(Peek(doomed.tokens).device().pages_size(), 0);
  EXPECT_EQ(Peek(local.tokens).host_hit_tokens(),
            static_cast<int64_t>(local.tokens.size()));
  {
    auto miss = session_->LoadBack(local.tokens);
    ASSERT_TRUE(miss.ok()) << miss.status();
    EXPECT_EQ(miss->started.load_id(), 0u);
    EXPECT_EQ(miss->started.miss_reason(), "lane_unavailable");
    if (miss->lock_handle() != 0) {
      EXPECT_TRUE(session_->UnlockHandles({miss->lock_handle()}).ok());
    }
  }
  {
    // Backups skip while degraded.
    Key skipped{Tokens(40000, 4 * page_size()), Allocate(4, {0, 1, 0, 1}), 14};
    EXPECT_EQ(Prepare(skipped), 0u);
    EXPECT_TRUE(session_->Free(skipped.pages).ok());
  }
  {
    const v1::CacheStats stats = LeaderStats();
    EXPECT_EQ(stats.pending_backups(), 0);
    // The two requests before the kill; the doomed backup failed (the
    // engine counts it as failed, which CacheStats does not carry).
    EXPECT_EQ(stats.backups_committed(), 2);
  }
  {
    auto ctl = testing::Run(
        {testing::CtlPath(), "stats", "--socket=" + group_->socket(0)});
    ASSERT_TRUE(ctl.ok()) << ctl.status();
    EXPECT_EQ(ctl->exit_code, 0) << ctl->err;
    EXPECT_TRUE(absl::StrContains(ctl->out, "CP group:")) << ctl->out;
    EXPECT_TRUE(absl::StrContains(ctl->out, "degraded")) << ctl->out;
    EXPECT_TRUE(absl::StrContains(ctl->out, "dead")) << ctl->out;
    EXPECT_TRUE(absl::StrContains(ctl->out, group_->member_name(1)))
        << ctl->out;
  }

  // The follower comes back with the same ranks and fresh pools.
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
  auto formed = group_->WaitFormed();
  ASSERT_TRUE(formed.ok()) << formed.status() << group_->DescribeLogs();
  const absl::Duration recover = absl::Now() - restarted;
  ASSERT_EQ(formed->members_size(), 2) << formed->ShortDebugString();
  EXPECT_EQ(formed->members(1).health(), "live");
  EXPECT_EQ(formed->members(1).readmissions(), 1);

  std::printf(
      "[cp_group] follower SIGKILL -> leader degraded: %.1f ms "
      "(heartbeat %d ms, timeout %d ms); restart -> formed: %.1f ms "
      "(process start included)\n",
      Ms(detect), group_->spec().heartbeat_ms, group_->spec().timeout_ms,
      Ms(recover));
  RecordProperty("follower_kill_to_degraded_ms",
                 static_cast<int>(Ms(detect)));
  RecordProperty("follower_restart_to_formed_ms",
                 static_cast<int>(Ms(recover)));

  // The leader-only request loads again, byte-exact; a new request round
  // trips on every rank, the restarted follower's included.
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(local, leader_ranks));
  const Key fresh = WriteAndCommit(60000, 9, 15);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(fresh));

  // Once more, a load racing a plain SIGKILL: it misses, fails, or is
  // byte-exact on the leader's ranks; never anything else.
  {
    v1::LoadBackRequest request;
    request.set_tokens(client::PackTokens(fresh.tokens));
    ASSERT_NO_FATAL_FAILURE(EvictDevice());
    auto racing = session_->StartLoadBack(request);
    ASSERT_TRUE(racing.ok()) << racing.status();
    const absl::Time killed_again = absl::Now();
    ASSERT_TRUE(group_->Kill(1).ok());
    v1::LoadBackEvent::Started racing_started;
    bool ok = false;
    uint64_t lock = 0;
    while ((*racing)->Next(&event)) {
      if (event.has_started()) racing_started = event.started();
      if (event.has_done()) {
        ok = event.done().ok();
        lock = event.done().lock_handle();
      }
    }
    EXPECT_TRUE((*racing)->Finish().ok());
    if (racing_started.load_id() == 0) {
      // Handled after the death: a miss, either because a lane is down or
      // because the request's host copy was dropped with the dead lanes.
      EXPECT_EQ(racing_started.loaded_tokens(), 0)
          << racing_started.ShortDebugString();
      EXPECT_TRUE(racing_started.miss_reason() == "lane_unavailable" ||
                  racing_started.miss_reason() == "none" ||
                  racing_started.miss_reason().empty())
          << racing_started.ShortDebugString();
    } else if (ok) {
      const auto& proto = racing_started.locations().pages();
      ASSERT_NO_FATAL_FAILURE(RunWorkers(
          "verify", std::vector<int64_t>(proto.begin(), proto.end()),
          fresh.seed, leader_ranks));
    }
    if (lock != 0) {
      EXPECT_TRUE(session_->UnlockHandles({lock}).ok());
    }
    auto again = group_->WaitForState(0, "degraded", absl::Seconds(20));
    ASSERT_TRUE(again.ok()) << again.status() << group_->DescribeLogs();
    const absl::Duration detect_again = absl::Now() - killed_again;
    std::printf("[cp_group] second follower SIGKILL -> degraded: %.1f ms\n",
                Ms(detect_again));
    RecordProperty("follower_kill_to_degraded_ms_2",
                   static_cast<int>(Ms(detect_again)));
    EXPECT_EQ(again->deaths(), 2);
  }
  const absl::Time restarted_again = absl::Now();
  ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
  auto reformed = group_->WaitFormed();
  ASSERT_TRUE(reformed.ok()) << reformed.status() << group_->DescribeLogs();
  std::printf("[cp_group] second restart -> formed: %.1f ms\n",
              Ms(absl::Now() - restarted_again));
  EXPECT_EQ(reformed->members(1).readmissions(), 2);
  const Key last = WriteAndCommit(70000, 8, 16);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(last));
  EXPECT_EQ(LeaderStats().pending_backups(), 0);
  ASSERT_NO_FATAL_FAILURE(StopGroupCleanly());
}

// Detection and recovery times over several rounds, for the record: a
// follower SIGKILLed (its connections reset: detected at the next heartbeat
// the leader cannot send) and a follower stopped with SIGSTOP (silent: only
// the heartbeat timeout finds it); each time restarted with the same ranks.
TEST_F(CpGroupTest, FollowerFailureDetectionAndRecoveryTimes) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0, 1}, {2, 3}})));
  const GroupSpec& spec = group_->spec();
  constexpr int kRounds = 5;
  std::vector<double> detect_ms, recover_ms;
  for (int round = 0; round <= kRounds; ++round) {
    const bool silent = round == kRounds;
    const absl::Time failed = absl::Now();
    ASSERT_TRUE(group_->Signal(1, silent ? SIGSTOP : SIGKILL).ok());
    auto degraded = group_->WaitForState(0, "degraded", absl::Seconds(20));
    ASSERT_TRUE(degraded.ok()) << degraded.status() << group_->DescribeLogs();
    const absl::Duration detect = absl::Now() - failed;
    EXPECT_EQ(degraded->deaths(), round + 1);
    if (silent) {
      // Not before the timeout (less the heartbeat in flight when it
      // stopped), and within it plus slack for a loaded machine.
      EXPECT_GE(detect, absl::Milliseconds(spec.timeout_ms - spec.heartbeat_ms -
                                           10));
      EXPECT_LT(detect, absl::Milliseconds(spec.timeout_ms) + absl::Seconds(10));
      std::printf(
          "[cp_group] silent follower (SIGSTOP) -> degraded: %.1f ms "
          "(timeout %d ms): %s\n",
          Ms(detect), spec.timeout_ms,
          degraded->members(1).reason().c_str());
      RecordProperty("silent_follower_to_degraded_ms",
                     static_cast<int>(Ms(detect)));
    } else {
      detect_ms.push_back(Ms(detect));
    }
    ASSERT_TRUE(group_->Kill(1).ok());
    const absl::Time restarted = absl::Now();
    ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
    auto formed = group_->WaitFormed();
    ASSERT_TRUE(formed.ok()) << formed.status() << group_->DescribeLogs();
    if (!silent) recover_ms.push_back(Ms(absl::Now() - restarted));
    ASSERT_EQ(formed->members_size(), 2);
    EXPECT_EQ(formed->members(1).readmissions(), round + 1);
  }
  // The group works after all that.
  const Key key = WriteAndCommit(1000, 9, 21);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "[cp_group] %d rounds, heartbeat %d ms, timeout %d ms: follower "
      "SIGKILL -> leader degraded median %.1f ms (max %.1f); restart -> "
      "formed median %.1f ms (max %.1f, process start included)\n",
      kRounds, spec.heartbeat_ms, spec.timeout_ms, median(detect_ms),
      *std::max_element(detect_ms.begin(), detect_ms.end()),
      median(recover_ms),
      *std::max_element(recover_ms.begin(), recover_ms.end()));
  RecordProperty("follower_kill_to_degraded_median_ms",
                 static_cast<int>(median(detect_ms)));
  RecordProperty("follower_restart_to_formed_median_ms",
                 static_cast<int>(median(recover_ms)));
}

// --- The leader dies --------------------------------------------------------

TEST_F(CpGroupTest, LeaderKilledEveryFollowerExitsNonZero) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0}, {1}, {2}, {3}})));
  backups_->Cancel();
  backups_.reset();
  session_.reset();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(group_->Kill(0).ok());
  // Bounded: the heartbeat timeout plus generous slack for a loaded CI box.
  const absl::Duration bound =
      absl::Milliseconds(group_->spec().timeout_ms) + absl::Seconds(15);
  absl::Duration slowest;
  for (size_t m = 1; m < group_->size(); ++m) {
    auto code = group_->WaitExit(m, bound - (absl::Now() - killed));
    ASSERT_TRUE(code.ok()) << group_->member_name(m)
                           << " still running: " << code.status()
                           << group_->DescribeLogs();
    slowest = std::max(slowest, absl::Now() - killed);
    EXPECT_NE(*code, 0) << group_->Log(m);
    EXPECT_LT(*code, 128) << "killed by a signal, not an exit: "
                          << group_->Log(m);
    const std::string log = group_->Log(m);
    EXPECT_TRUE(absl::StrContains(log, "lost")) << log;
    EXPECT_TRUE(absl::StrContains(log, "leader")) << log;
    EXPECT_FALSE(absl::StrContains(log, "Sanitizer")) << log;
  }
  std::printf("[cp_group] leader SIGKILL -> every follower exited: %.1f ms\n",
              Ms(slowest));
  RecordProperty("leader_kill_to_follower_exit_ms",
                 static_cast<int>(Ms(slowest)));
}

}  // namespace
}  // namespace hicache::cp_group_testing
