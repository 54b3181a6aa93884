// The engine's KV-event side (engine_tier_events.cc; docs/kv-events.md): a
// host copy is announced only once it has committed, also when its copies
// are held back; a tier move announces the new tier before it removes the
// old one; QueryTiers is a pure lookup; a resync and a namespace move report
// exactly what the tree holds.
#include <thread>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"
#include "tests/testing/tier_recorder.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

constexpr uint32_t kP = 4;
using testing::Seq;
using testing::TierRecorder;
using testing::WriteKv;
using Kind = TierEvent::Kind;

class TierEventsTest : public ::testing::Test {
 protected:
  void Make(EngineOptions options) {
    options.page_size = kP;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = 32;
    options.host_pages_per_rank = 64;
    options.tier_listener = &recorder_;
    options.tier_block_size = 2;  // Two blocks a page.
    options.tier_hash_seed = 5;
    options.wrap_transfer = [this](TransferListener* listener,
                                   const TransferEngineFactory& backend) {
      auto faults = std::make_unique<FaultyTransferEngine>(listener, backend);
      faults_ = faults.get();
      return faults;
    };
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }

  void Insert(const std::vector<int32_t>& tokens) {
    std::vector<Rank> owners((tokens.size() + kP - 1) / kP, 0);
    auto pages = engine_->AllocateWithOwners(owners);
    ASSERT_TRUE(pages.ok()) << pages.status();
    WriteKv(*engine_, tokens, *pages, 0);
    ASSERT_TRUE(engine_->Insert("", tokens, *pages).ok());
  }

  int64_t Count(Tier tier) const { return recorder_.Count(tier); }

  TierRecorder recorder_{2, 5};
  FaultyTransferEngine* faults_ = nullptr;
  std::unique_ptr<HiCacheEngine> engine_;
};

TEST_F(TierEventsTest, AHostCopyIsAnnouncedOnlyOnceItCommitted) {
  Make({.write_policy = WritePolicy::kWriteThrough});
  faults_->HoldWhen([](const TransferSite& s) {
    return s.direction == TransferDirection::kDeviceToHost;
  });
  const std::vector<int32_t> tokens = Seq(0, 8);
  Insert(tokens);
  EXPECT_EQ(Count(Tier::kDevice), 4);  // Two pages, two blocks each.
  // Write-through starts the backup at the hit; its copies are held.
  ASSERT_EQ(engine_->Match("", tokens)->device_len, 8);
  while (faults_->held() == 0) std::this_thread::yield();
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 1);
  EXPECT_EQ(Count(Tier::kHost), 0) << "announced before the bytes landed";
  faults_->HoldWhen(nullptr);
  faults_->ReleaseHeld();
  engine_->WaitForTransfers();
  EXPECT_EQ(Count(Tier::kHost), 4);
  // Evicted from the device: host stored came first, device removed now.
  ASSERT_TRUE(engine_->EvictPages({1 << 20}, {}).ok());
  EXPECT_EQ(Count(Tier::kDevice), 0);
  EXPECT_EQ(Count(Tier::kHost), 4);
  ASSERT_FALSE(recorder_.log.empty());
  EXPECT_EQ(recorder_.log.back().kind, Kind::kRemoved);
  EXPECT_EQ(recorder_.log.back().tier, Tier::kDevice);
  // Loaded back: stored on device again, still on host.
  auto load = engine_->LoadBack("", tokens);
  ASSERT_TRUE(load.ok()) << load.status();
  engine_->WaitForTransfers();
  ASSERT_NE(load->op_id, 0u);
  ASSERT_TRUE(*engine_->LoadDone(load->op_id));
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  EXPECT_EQ(Count(Tier::kDevice), 4);
  EXPECT_EQ(Count(Tier::kHost), 4);
  EXPECT_TRUE(recorder_.errors.empty()) << recorder_.errors.front();
  EXPECT_TRUE(engine_->CheckInvariants().ok());
}

TEST_F(TierEventsTest, AFailedBackupIsNeverAnnounced) {
  Make({.write_policy = WritePolicy::kWriteThrough});
  faults_->FailWhen([](const TransferSite& s) {
    return s.direction == TransferDirection::kDeviceToHost;
  });
  const std::vector<int32_t> tokens = Seq(0, 8);
  Insert(tokens);
  ASSERT_EQ(engine_->Match("", tokens)->device_len, 8);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_failed, 1);
  EXPECT_EQ(Count(Tier::kHost), 0);
  EXPECT_TRUE(recorder_.errors.empty());
}

TEST_F(TierEventsTest, QueryTiersIsAPureLookup) {
  Make({.write_policy = WritePolicy::kWriteThrough});
  const std::vector<int32_t> tokens = Seq(0, 12);
  Insert(tokens);
  ASSERT_EQ(engine_->Match("", tokens)->device_len, 12);  // Backs it up.
  engine_->WaitForTransfers();
  const std::vector<int32_t> longer = Seq(0, 20);
  Insert(longer);  // 8 more tokens on device only.
  ASSERT_TRUE(engine_->EvictPages({1 << 20}, {}).ok());  // Host keeps 12.
  const int64_t matches = engine_->Stats().match_calls;
  const auto before = engine_->Dump({});
  const std::vector<int32_t> shorter = Seq(0, 6);
  std::vector<HiCacheEngine::TierQuery> queries = {
      {"", longer}, {"", shorter}, {"other", longer}, {"", {}}};
  std::vector<HiCacheEngine::TierHit> hits = engine_->QueryTiers(queries);
  ASSERT_EQ(hits.size(), 4u);
  EXPECT_EQ(hits[0].device_tokens, 0);
  EXPECT_EQ(hits[0].host_tokens, 12);
  EXPECT_EQ(hits[2].device_tokens + hits[2].host_tokens, 0);
  EXPECT_EQ(hits[3].device_tokens + hits[3].host_tokens, 0);
  // What a scheduler's peek would be told (page-floored; a host hit counts
  // whole nodes, as a load-back attaches whole nodes).
  for (size_t i = 0; i < queries.size(); ++i) {
    auto peek = engine_->Match(queries[i].ns, queries[i].tokens, /*peek=*/true,
                               /*lock=*/false, /*exact_tail=*/false);
    ASSERT_TRUE(peek.ok());
    EXPECT_EQ(hits[i].device_tokens, peek->device_len) << i;
    EXPECT_EQ(hits[i].host_tokens, peek->host_hit_len) << i;
  }
  EXPECT_EQ(engine_->Stats().match_calls, matches);
  const auto after = engine_->Dump({});
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_EQ(before[i].hit_count, after[i].hit_count);
    EXPECT_EQ(before[i].last_access_ns, after[i].last_access_ns);
    EXPECT_EQ(before[i].lock_ref, after[i].lock_ref);
  }
}

TEST_F(TierEventsTest, ResyncAndNamespaceMovesReportExactlyTheTree) {
  Make({.write_policy = WritePolicy::kWriteThrough});
  Insert(Seq(0, 8));
  Insert(Seq(100, 13));  // A sub-page tail: its last token is not announced.
  ASSERT_EQ(engine_->Match("", Seq(0, 8))->device_len, 8);
  engine_->WaitForTransfers();
  const std::set<TierRecorder::Key> held = recorder_.held;
  EXPECT_EQ(Count(Tier::kDevice), 4 + 6);
  engine_->ResyncTierEvents();
  EXPECT_EQ(recorder_.clears, 1);
  EXPECT_EQ(recorder_.held, held);
  int between = 0;
  engine_->ReannounceNamespace("", [&] {
    ++between;
    EXPECT_TRUE(recorder_.held.empty());  // Withdrawn first.
  });
  EXPECT_EQ(between, 1);
  EXPECT_EQ(recorder_.held, held);
  EXPECT_TRUE(recorder_.errors.empty()) << recorder_.errors.front();
  // Detached: nothing more is reported.
  engine_->DetachTierListener();
  const int64_t events = recorder_.events;
  Insert(Seq(200, 8));
  EXPECT_EQ(recorder_.events, events);
}

TEST(TierEventsOptionsTest, ABlockSizeThatDoesNotDivideThePageIsRefused) {
  TierRecorder recorder(3, 0);
  EngineOptions options;
  options.page_size = 4;
  options.kv_preset = "tiny";
  options.tier_listener = &recorder;
  options.tier_block_size = 3;
  EXPECT_EQ(HiCacheEngine::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hicache
