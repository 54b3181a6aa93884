// Smoke test of bench/cp_group_rig: both rigs (one daemon; leader +
// follower over Gloo TCP on 127.0.0.1) commit every backup, the timings are
// ordered as defined, every key is evicted afterwards (the pools never
// fill), and the engines' invariants hold. Figures are not checked.

#include "bench/cp_group_rig.h"

#include <memory>

#include "gtest/gtest.h"

namespace hicache::bench {
namespace {

CommitRigOptions SmallOptions() {
  CommitRigOptions options;
  options.pages_per_backup = 4;
  options.device_pages_per_rank = 16;
  options.host_pages_per_rank = 32;
  // Generous: a loaded CI machine under TSan must not see a false death.
  options.heartbeat_interval = absl::Milliseconds(50);
  options.heartbeat_timeout = absl::Seconds(20);
  return options;
}

void RunBackups(CommitRig& rig, int n, int64_t first_key) {
  for (int i = 0; i < n; ++i) {
    auto timing = rig.Backup(first_key + i);
    ASSERT_TRUE(timing.ok()) << rig.name() << " backup " << i << ": "
                             << timing.status();
    EXPECT_GE(timing->ack_to_commit_us, 0);
    EXPECT_GE(timing->step_to_commit_us, 0);
    // The local ack comes before its step event, both after the prepare.
    EXPECT_LE(timing->step_to_commit_us, timing->ack_to_commit_us);
    EXPECT_LE(timing->ack_to_commit_us, timing->end_to_end_us);
  }
  // Each backup's pages were evicted: more backups than the pools hold
  // committed, and nothing is left behind.
  EXPECT_EQ(rig.engine().TreeDevicePages(), 0);
  EXPECT_EQ(rig.engine().HostUsedPages(0), 0);
  EXPECT_EQ(rig.engine().HostUsedPages(1), 0);
  EXPECT_EQ(rig.engine().Stats().backups_committed, n);
  EXPECT_TRUE(rig.engine().CheckInvariants().ok());
}

TEST(CpGroupRigTest, BaselineCommitsEveryBackup) {
  auto rig = CommitRig::Baseline(SmallOptions());
  ASSERT_TRUE(rig.ok()) << rig.status();
  RunBackups(**rig, 20, 1);
}

TEST(CpGroupRigTest, GroupCommitsEveryBackupOverGloo) {
  auto rig = CommitRig::Group(SmallOptions());
  ASSERT_TRUE(rig.ok()) << rig.status();
  RunBackups(**rig, 20, 1);
}

TEST(CpGroupRigTest, BackToBackStepsCommitToo) {
  CommitRigOptions options = SmallOptions();
  options.drain_before_last_step = false;
  auto rig = CommitRig::Group(options);
  ASSERT_TRUE(rig.ok()) << rig.status();
  RunBackups(**rig, 10, 100);
}

TEST(CpGroupRigTest, TreeCallsAreTimed) {
  auto rig = CommitRig::Group(SmallOptions());
  ASSERT_TRUE(rig.ok()) << rig.status();
  auto match = (*rig)->TimeMatch(7);
  ASSERT_TRUE(match.ok()) << match.status();
  EXPECT_GE(*match, 0);
  auto allocate = (*rig)->TimeAllocate();
  ASSERT_TRUE(allocate.ok()) << allocate.status();
  EXPECT_GE(*allocate, 0);
  EXPECT_EQ((*rig)->engine().AllRequestPages(), 0);  // Freed again.
}

TEST(CpGroupRigTest, RefusesBackupsThatCannotSpanBothRanks) {
  CommitRigOptions options = SmallOptions();
  options.pages_per_backup = 1;
  EXPECT_EQ(CommitRig::Baseline(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.pages_per_backup = 64;  // More than the pools.
  EXPECT_EQ(CommitRig::Group(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hicache::bench
