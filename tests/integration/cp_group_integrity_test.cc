// CP groups across daemons with real processes (issue 13, docs/cp-groups.md):
// byte integrity and membership checks. hicached processes on localhost form
// a group over Gloo TCP, this test is the scheduler on the leader, and one
// kv_agent worker process per rank maps that rank's device pool through the
// daemon that holds it (the leader or a follower), writes the KV of its pages
// and later verifies every byte that load-back brought back.
//
// - Integrity: C = 4 split 2 + 2 and 1 + 3, C = 8 split 4 + 4, C = 4 split
//   1 + 1 + 1 + 1 (four processes): allocate with zigzag owners, write,
//   back up layer by layer (the scheduler's layer_stored acks every rank),
//   insert, commit, evict from the device, load back, verify every byte on
//   every rank. Followers refuse tree RPCs (MatchPrefix, a scheduler's
//   OpenSession) with FAILED_PRECONDITION and the leader's target in the
//   `hicache-leader` trailer; hicachectl stats on a follower names it.
// - A follower whose geometry or ranks do not fit is refused, named.
//
// Failures (followers and the leader killed) are in cp_group_failure_test.cc;
// workers' own events and acks in cp_group_worker_test.cc.
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

// --- Integrity ---------------------------------------------------------------

class CpGroupIntegrityTest : public CpGroupTest,
                             public ::testing::WithParamInterface<GroupSpec> {};

TEST_P(CpGroupIntegrityTest, EveryByteRoundTripsThroughTheGroup) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(GetParam()));
  auto leader = group_->GetStats(0);
  ASSERT_TRUE(leader.ok()) << leader.status();
  ASSERT_TRUE(leader->has_cp_group());
  EXPECT_EQ(leader->cp_group().state(), "formed");
  ExpectLeaderSeesEveryMemberLive(leader->cp_group());
  for (size_t m = 1; m < group_->size(); ++m) {
    auto stats = group_->GetStats(m);
    ASSERT_TRUE(stats.ok()) << stats.status();
    const v1::CpGroupStatus& g = stats->cp_group();
    EXPECT_EQ(g.role(), "follower") << g.ShortDebugString();
    EXPECT_EQ(g.state(), "formed") << g.ShortDebugString();
    EXPECT_EQ(g.cp_size(), cp());
    EXPECT_EQ(g.leader_address(), group_->leader_target());
    ASSERT_NO_FATAL_FAILURE(ExpectRedirect(m));
  }

  // Zigzag over every lane, a few pages per lane.
  const Key key = WriteAndCommit(1000, static_cast<int>(2 * cp() + 1), 3);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  EXPECT_EQ(Peek(key.tokens).device().pages_size(), 0);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  // A second request on the same (now freed and reused) physical pages with
  // another pattern: what comes back is this one's, not the first's.
  const Key second = WriteAndCommit(50000, static_cast<int>(2 * cp() + 1), 7);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(second));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  const v1::CacheStats stats = LeaderStats();
  EXPECT_GE(stats.backups_committed(), 2);
  EXPECT_EQ(stats.backups_rolled_back(), 0);
  EXPECT_EQ(stats.pending_backups(), 0);
  EXPECT_EQ(stats.lanes_size(), static_cast<int>(cp()));
  // Still formed, no death along the way.
  auto after = group_->GetStats(0);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->cp_group().state(), "formed");
  EXPECT_EQ(after->cp_group().deaths(), 0)
      << after->cp_group().ShortDebugString() << "\n"
      << GrepLogs("lost") << group_->DescribeLogs(15);
  EXPECT_EQ(stats.backups_failed(), 0);
  // The data path to every follower, as the leader's GetStats shows it:
  // steps completed, no divergence, nothing failed.
  ASSERT_EQ(after->cp_group().members_size(), static_cast<int>(group_->size()));
  for (int m = 1; m < after->cp_group().members_size(); ++m) {
    const v1::CpGroupMember& member = after->cp_group().members(m);
    ASSERT_TRUE(member.has_transfer()) << member.ShortDebugString();
    EXPECT_GT(member.transfer().steps_completed(), 0)
        << member.ShortDebugString();
    EXPECT_GE(member.transfer().digests_matched(), 0);
    EXPECT_EQ(member.transfer().digest_divergences(), 0)
        << member.ShortDebugString();
    EXPECT_EQ(member.transfer().steps_failed(), 0)
        << member.ShortDebugString();
  }
  ASSERT_NO_FATAL_FAILURE(StopGroupCleanly());
}

INSTANTIATE_TEST_SUITE_P(
    Splits, CpGroupIntegrityTest,
    ::testing::Values(Spec(4, {{0, 1}, {2, 3}}), Spec(4, {{0}, {1, 2, 3}}),
                      Spec(8, {{0, 1, 2, 3}, {4, 5, 6, 7}}),
                      Spec(4, {{0}, {1}, {2}, {3}})),
    [](const ::testing::TestParamInfo<GroupSpec>& info) {
      return SplitLabel(info.param);
    });

// --- Refused joins ----------------------------------------------------------

TEST_F(CpGroupTest, MismatchedOrOverlappingFollowerIsRefusedNamingWhy) {
  group_ = std::make_unique<CpGroup>(Spec(4, {{0, 1}, {2, 3}}));
  ASSERT_TRUE(group_->StartLeader().ok()) << group_->DescribeLogs();

  // Another page size: refused for good, naming the field.
  ASSERT_TRUE(group_->LaunchFollower(1, {"--page_size=8"}).ok());
  auto code = group_->WaitExit(1, absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status() << group_->DescribeLogs();
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(absl::StrContains(group_->Log(1), "page_size"))
      << group_->Log(1);

  // Ranks the leader holds: refused, naming the rank.
  ASSERT_TRUE(group_->LaunchFollower(1, {"--ranks=1,2"}).ok());
  code = group_->WaitExit(1, absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status() << group_->DescribeLogs();
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(absl::StrContains(group_->Log(1), "rank 1")) << group_->Log(1);

  // The leader is unharmed and still forming; the right follower forms it.
  auto forming = group_->GetStats(0);
  ASSERT_TRUE(forming.ok()) << forming.status();
  EXPECT_EQ(forming->cp_group().state(), "forming");
  ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
  auto formed = group_->WaitFormed();
  ASSERT_TRUE(formed.ok()) << formed.status() << group_->DescribeLogs();
}

}  // namespace
}  // namespace hicache::cp_group_testing
