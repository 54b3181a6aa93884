// SessionManager::NamespaceLayerStored: a CP group follower's worker ack,
// relayed to the leader, stores exactly what a local worker session of that
// namespace and rank may store (CPU backend, C = 2, P = 4, preset "tiny").
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "daemon/core/clock.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

constexpr int64_t kP = 4;
constexpr int64_t kTokens = 8;

class NamespaceLayerStoredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.page_size = kP;
    options.cp_size = 2;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = 32;
    options.host_pages_per_rank = 64;
    options.write_policy = WritePolicy::kWriteBack;
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1));
    auto info = sessions_->Open("s", SessionRole::kScheduler, 0, "ns",
                                absl::Minutes(1));
    ASSERT_TRUE(info.ok()) << info.status();
    scheduler_ = info->id;
    auto pages = sessions_->Allocate(scheduler_, {AllocationItem{.num_pages = 2}});
    ASSERT_TRUE(pages.ok()) << pages.status();
    pages_ = pages->front();
    auto ids = sessions_->PrepareBackups(scheduler_, {BackupSpec{pages_, kTokens}});
    ASSERT_TRUE(ids.ok()) << ids.status();
    backup_ = ids->front();
  }

  RealClock clock_;
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  std::string scheduler_;
  std::vector<LogicalPage> pages_;
  uint64_t backup_ = 0;
};

TEST_F(NamespaceLayerStoredTest, EveryRankAckedCommitsTheBackup) {
  const uint32_t steps = engine_->geometry().NumSteps();
  for (uint32_t s = 0; s < steps; ++s) {
    for (Rank r : {Rank{0}, Rank{1}}) {
      ASSERT_TRUE(sessions_->NamespaceLayerStored("ns", r, {backup_}, s).ok());
    }
  }
  std::vector<int32_t> tokens(kTokens);
  std::iota(tokens.begin(), tokens.end(), 1);
  auto inserted = sessions_->Insert(
      scheduler_, {SessionInsertItem{
                      .tokens = tokens, .pages = pages_, .backup_id = backup_}});
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  EXPECT_TRUE(inserted->front().backup_attached);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
}

TEST_F(NamespaceLayerStoredTest, RefusesWhatAWorkerOfTheNamespaceMayNotStore) {
  // Another namespace, an unknown op, a bad rank, too many ops: refused,
  // nothing submitted.
  absl::Status other = sessions_->NamespaceLayerStored("other", 0, {backup_}, 0);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument) << other;
  EXPECT_NE(other.message().find("not a backup of this worker's namespace"),
            std::string::npos);
  EXPECT_EQ(sessions_->NamespaceLayerStored("ns", 0, {backup_ + 1000}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sessions_->NamespaceLayerStored("ns", 2, {backup_}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint64_t> many(sessions_->limits().max_items_per_request + 1,
                             backup_);
  EXPECT_EQ(sessions_->NamespaceLayerStored("ns", 0, many, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Stats().backups_committed, 0);
  // Still storable afterwards: nothing was marked.
  EXPECT_TRUE(sessions_->NamespaceLayerStored("ns", 0, {backup_}, 0).ok());
}

}  // namespace
}  // namespace hicache
