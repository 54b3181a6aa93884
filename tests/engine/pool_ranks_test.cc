// EngineOptions::pool_ranks (a CP group's leader, docs/cp-groups.md): the
// engine serves every rank (each one's acks count) but holds pools only for
// its own; the other ranks' copies leave through `wrap_transfer` and their
// completions come back through the same listener, so the engine does not
// know a rank is remote.
#include <numeric>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "daemon/transfer/transfer_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"
#include "tests/engine/split_transfer_engine.h"

namespace hicache {
namespace {

using testing::VerifyKv;
using testing::WriteKv;

constexpr uint32_t kP = 4;

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class PoolRanksTest : public ::testing::Test {
 protected:
  // C = 2, both ranks served, pools for rank 0 only; rank 1 is remote.
  void Make(absl::Status remote_status = absl::OkStatus()) {
    EngineOptions options{.page_size = kP,
                          .cp_size = 2,
                          .kv_preset = "tiny-draft",
                          .device_pages_per_rank = 32,
                          .host_pages_per_rank = 64};
    options.pool_ranks = {0};
    options.wrap_transfer = [this, remote_status](
                                TransferListener* listener,
                                const TransferEngineFactory& backend) {
      auto split = std::make_unique<testing::SplitTransferEngine>(
          listener, backend, std::vector<Rank>{0}, remote_status);
      split_ = split.get();
      return split;
    };
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }
  // Backs up `tokens` on pages of `owners`, writing only rank 0's bytes
  // (rank 1's live in another daemon). Returns whether it committed. A
  // remote step that fails may come back before AttachBackup, which then
  // answers ABORTED: allowed only when `may_abort`.
  bool Cache(const std::vector<int32_t>& tokens,
             const std::vector<Rank>& owners, bool may_abort = false) {
    auto pages = engine_->AllocateWithOwners(owners);
    EXPECT_TRUE(pages.ok()) << pages.status();
    if (!pages.ok()) return false;
    auto ops = engine_->PrepareBackups(
        {BackupSpec{*pages, static_cast<int64_t>(tokens.size())}});
    EXPECT_TRUE(ops.ok()) << ops.status();
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      EXPECT_TRUE(engine_->LayerStored(*ops, s).ok());
    }
    auto inserted = engine_->Insert("", tokens, *pages);
    EXPECT_TRUE(inserted.ok());
    const absl::Status attached =
        engine_->AttachBackup((*ops)[0], inserted->node);
    if (may_abort && absl::IsAborted(attached)) {
      EXPECT_TRUE(engine_->RollbackBackup((*ops)[0]).ok());
    } else {
      EXPECT_TRUE(attached.ok()) << attached;
    }
    engine_->WaitForTransfers();
    return engine_->Stats().backups_committed > 0;
  }

  std::unique_ptr<HiCacheEngine> engine_;
  testing::SplitTransferEngine* split_ = nullptr;
};

TEST_F(PoolRanksTest, PoolsOnlyForPoolRanksWhileEveryServedRankAcks) {
  ASSERT_NO_FATAL_FAILURE(Make());
  EXPECT_NE(engine_->pools().device(0), nullptr);
  EXPECT_NE(engine_->pools().host(0), nullptr);
  EXPECT_EQ(engine_->pools().device(1), nullptr);
  EXPECT_EQ(engine_->pools().host(1), nullptr);
  EXPECT_EQ(engine_->layout().served_ranks(), (std::vector<Rank>{0, 1}));
  EXPECT_EQ(engine_->pools().layout().served_ranks(), (std::vector<Rank>{0}));

  // Zigzag owners: both ranks copy; the op commits on both ranks' acks,
  // rank 1's coming back through the decorator.
  ASSERT_TRUE(Cache(Seq(0, 16), {0, 1, 0, 1}));
  const int steps = static_cast<int>(engine_->geometry().NumSteps());
  EXPECT_EQ(split_->remote_steps(), steps);  // Rank 1's, every step.
  EXPECT_EQ(engine_->HostUsedPages(0), 2);
  EXPECT_EQ(engine_->HostUsedPages(1), 2);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

// A remote rank's failed step (its daemon died) rolls the backup back, as a
// failed local copy does: nothing of it is served.
TEST_F(PoolRanksTest, ARemoteRanksFailedStepRollsTheBackupBack) {
  ASSERT_NO_FATAL_FAILURE(
      Make(absl::UnavailableError("follower 1 at 10.0.0.2:7070 is gone")));
  EXPECT_FALSE(Cache(Seq(0, 16), {0, 1, 0, 1}, /*may_abort=*/true));
  EXPECT_EQ(engine_->Stats().backups_committed, 0);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->HostUsedPages(1), 0);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

// Pages owned by the local rank only: the remote rank acks steps with no
// pages (as a served rank with nothing to copy does), and rank 0's bytes
// load back exactly.
TEST_F(PoolRanksTest, LocalOnlyPagesLoadBackExactly) {
  ASSERT_NO_FATAL_FAILURE(Make());
  const std::vector<int32_t> tokens = Seq(100, 8);
  auto pages = engine_->AllocateWithOwners({0, 0});
  ASSERT_TRUE(pages.ok()) << pages.status();
  WriteKv(*engine_, tokens, *pages, 0);
  auto ops = engine_->PrepareBackups({BackupSpec{*pages, 8}});
  ASSERT_TRUE(ops.ok());
  for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  auto inserted = engine_->Insert("", tokens, *pages);
  ASSERT_TRUE(inserted.ok());
  ASSERT_TRUE(engine_->AttachBackup((*ops)[0], inserted->node).ok());
  engine_->WaitForTransfers();
  ASSERT_EQ(engine_->Stats().backups_committed, 1);
  // Push it out of the device tier, then load it back.
  auto all = engine_->Allocate((engine_->options().device_pages_per_rank - 1) *
                               2);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_TRUE(engine_->Free(*all).ok());
  auto load = engine_->LoadBack("", tokens);
  ASSERT_TRUE(load.ok()) << load.status();
  engine_->WaitForTransfers();
  ASSERT_NE(load->op_id, 0u);
  EXPECT_EQ(load->loaded_len, 8);
  ASSERT_TRUE(*engine_->LoadDone(load->op_id));
  EXPECT_TRUE(VerifyKv(*engine_, tokens, load->pages, 8).ok());
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

TEST(PoolRanksOptionsTest, PoolRanksMustBeServedAndAStateDirNeedsThemAll) {
  EngineOptions options{.page_size = kP,
                        .cp_size = 4,
                        .kv_preset = "tiny",
                        .device_pages_per_rank = 8,
                        .host_pages_per_rank = 8};
  options.served_ranks = {0, 1};
  options.pool_ranks = {2};
  auto foreign = HiCacheEngine::Create(options);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(foreign.status().message().find("pool rank 2"), std::string::npos)
      << foreign.status();
  options.served_ranks = {};
  options.pool_ranks = {0, 1};
  options.state_dir = "/nonexistent-hicache-state";
  auto persisted = HiCacheEngine::Create(options);
  EXPECT_EQ(persisted.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(persisted.status().message().find("state_dir"), std::string::npos)
      << persisted.status();
}

}  // namespace
}  // namespace hicache
