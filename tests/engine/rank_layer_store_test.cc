// Per-rank layer_stored (issue 12, item 1): each worker stores its own
// rank's layers; a step is stored once every served rank stored it, by its
// worker or by the scheduler's whole-step layer_stored; nothing is copied
// twice and the bytes survive eviction and load-back.
#include <memory>
#include <numeric>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"

namespace hicache {
namespace {

constexpr uint32_t kP = 4;

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class RankLayerStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = HiCacheEngine::Create({.page_size = kP,
                                         .cp_size = 2,
                                         .kv_preset = "tiny-draft",
                                         .device_pages_per_rank = 16,
                                         .host_pages_per_rank = 32});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    pages_ = *engine_->AllocateWithOwners({0, 1, 1, 0});
    testing::WriteKv(*engine_, tokens_, pages_, 0);
    ops_ = *engine_->PrepareBackups(
        {BackupSpec{pages_, static_cast<int64_t>(tokens_.size())}});
    ASSERT_NE(ops_[0], 0u);
  }

  uint32_t Steps() const { return engine_->geometry().NumSteps(); }

  void InsertAndAttach() {
    auto inserted = engine_->Insert("", tokens_, pages_);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    ASSERT_TRUE(engine_->AttachBackup(ops_[0], inserted->node).ok());
  }

  // Evicts the device copy and loads it back; the bytes must be intact.
  void ExpectLoadBackIntact() {
    auto all = engine_->Allocate(2 * 15);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_TRUE(engine_->Free(*all).ok());
    auto load = engine_->LoadBack("", tokens_);
    ASSERT_TRUE(load.ok()) << load.status();
    ASSERT_EQ(load->loaded_len, static_cast<int64_t>(tokens_.size()));
    engine_->WaitForTransfers();
    ASSERT_TRUE(*engine_->LoadDone(load->op_id));
    EXPECT_TRUE(testing::VerifyKv(*engine_, tokens_, load->pages,
                                  tokens_.size())
                    .ok());
    ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }

  const std::vector<int32_t> tokens_ = Seq(0, 16);
  std::unique_ptr<HiCacheEngine> engine_;
  std::vector<LogicalPage> pages_;
  std::vector<uint64_t> ops_;
};

TEST_F(RankLayerStoreTest, EachWorkerStoresItsOwnRank) {
  for (uint32_t s = 0; s < Steps(); ++s) {
    ASSERT_TRUE(engine_->RankLayerStored(ops_, s, 0).ok());
  }
  engine_->WaitForTransfers();
  // Rank 1 has not stored anything: the backup still needs its client.
  EXPECT_TRUE(*engine_->BackupAwaitsClient(ops_[0]));
  const int64_t bytes_after_rank0 = engine_->Stats().bytes_to_host;
  // Storing rank 0 again copies nothing more.
  ASSERT_TRUE(engine_->RankLayerStored(ops_, 0, 0).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().bytes_to_host, bytes_after_rank0);
  for (uint32_t s = 0; s < Steps(); ++s) {
    ASSERT_TRUE(engine_->RankLayerStored(ops_, s, 1).ok());
  }
  ASSERT_NO_FATAL_FAILURE(InsertAndAttach());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  // Each rank copied its own two pages per step, once.
  EXPECT_EQ(engine_->Stats().bytes_to_host,
            4 * engine_->geometry().BytesPerPage());
  ASSERT_NO_FATAL_FAILURE(ExpectLoadBackIntact());
}

TEST_F(RankLayerStoreTest, SchedulerStoresWhatWorkersHaveNot) {
  // Rank 1's worker stored step 0; the scheduler then stores every step.
  ASSERT_TRUE(engine_->RankLayerStored(ops_, 0, 1).ok());
  for (uint32_t s = 0; s < Steps(); ++s) {
    ASSERT_TRUE(engine_->LayerStored(ops_, s).ok());
  }
  // Later worker messages for stored steps change nothing.
  ASSERT_TRUE(engine_->RankLayerStored(ops_, 1, 0).ok());
  ASSERT_NO_FATAL_FAILURE(InsertAndAttach());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  EXPECT_EQ(engine_->Stats().bytes_to_host,
            4 * engine_->geometry().BytesPerPage());
  ASSERT_NO_FATAL_FAILURE(ExpectLoadBackIntact());
}

TEST_F(RankLayerStoreTest, RefusalsChangeNothing) {
  EXPECT_EQ(engine_->RankLayerStored(ops_, 0, 2).code(),
            absl::StatusCode::kInvalidArgument);  // No rank 2 (C = 2).
  EXPECT_EQ(engine_->RankLayerStored(ops_, Steps(), 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->RankLayerStored(ops_, 0, 0, /*fence=*/5).code(),
            absl::StatusCode::kInvalidArgument);  // The CPU backend: none.
  const uint64_t unknown[] = {ops_[0] + 100};
  EXPECT_EQ(engine_->RankLayerStored(unknown, 0, 0).code(),
            absl::StatusCode::kNotFound);
  // Reproduction: a repeated id was accepted and counted once.
  const uint64_t twice[] = {ops_[0], ops_[0]};
  EXPECT_EQ(engine_->RankLayerStored(twice, 0, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->LayerStored(twice, 0).code(),
            absl::StatusCode::kInvalidArgument);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().bytes_to_host, 0);
  ASSERT_TRUE(engine_->RollbackBackup(ops_[0]).ok());
  ASSERT_TRUE(engine_->Free(pages_).ok());
  engine_->WaitForTransfers();
  EXPECT_TRUE(engine_->CheckInvariants().ok());
}

}  // namespace
}  // namespace hicache
