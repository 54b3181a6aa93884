// The engine under injected transfer failures (FaultyTransferEngine through
// EngineOptions::wrap_transfer). Preset "tiny-draft" at P = 4: 2 target
// layers + 1 draft layer = 3 steps. Failed copies are dropped, so the
// destination keeps stale bytes: a backup committed or a load attached
// despite a failure would serve them.
#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"

namespace hicache {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;
using testing::VerifyKv;
using testing::WriteKv;

constexpr uint32_t kP = 4;
constexpr auto kD2H = TransferDirection::kDeviceToHost;
constexpr auto kH2D = TransferDirection::kHostToDevice;

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// What the scheduler hears.
class RecordingListener : public EngineListener {
 public:
  using Step = std::tuple<uint64_t, Rank, uint32_t>;
  void OnOpEvent(const OpEvent& e) override {
    MutexLock lock(&mu_);
    switch (e.type) {
      case OpEvent::Type::kBackupStep:
        backup_steps_.push_back({e.op, e.rank, e.step});
        break;
      case OpEvent::Type::kCommitted:
        committed_.push_back(e.op);
        break;
      case OpEvent::Type::kRolledBack:
        rolled_back_.push_back(e.op);
        break;
      case OpEvent::Type::kLoadStep:
        load_steps_.push_back({e.op, e.rank, e.step});
        break;
      case OpEvent::Type::kLoadDone:
        load_done_.push_back({e.op, e.ok});
        break;
    }
  }
  // Events reach the listener after the engine's state changed (and after
  // WaitForTransfers returns): poll for the one expected. A failed op's end
  // is its last event, so after it every earlier event has been delivered.
  template <typename Cond>
  void Await(Cond cond) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!cond()) {
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "the expected engine event never came";
        return;
      }
      absl::SleepFor(absl::Microseconds(100));
    }
  }
  void AwaitRolledBack(uint64_t op) {
    Await([&] { return Has(rolled_back(), op); });
  }
  void AwaitCommitted(uint64_t op) {
    Await([&] { return Has(committed(), op); });
  }
  void AwaitLoadDone(uint64_t op) {
    Await([&] {
      for (const auto& [id, ok] : load_done()) {
        if (id == op) return true;
      }
      return false;
    });
  }
  static bool Has(const std::vector<uint64_t>& ops, uint64_t op) {
    return std::find(ops.begin(), ops.end(), op) != ops.end();
  }

  std::vector<Step> backup_steps() {
    MutexLock lock(&mu_);
    return backup_steps_;
  }
  std::vector<uint64_t> committed() {
    MutexLock lock(&mu_);
    return committed_;
  }
  std::vector<uint64_t> rolled_back() {
    MutexLock lock(&mu_);
    return rolled_back_;
  }
  std::vector<Step> load_steps() {
    MutexLock lock(&mu_);
    return load_steps_;
  }
  std::vector<std::pair<uint64_t, bool>> load_done() {
    MutexLock lock(&mu_);
    return load_done_;
  }

 private:
  Mutex mu_;
  std::vector<Step> backup_steps_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> committed_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> rolled_back_ ABSL_GUARDED_BY(mu_);
  std::vector<Step> load_steps_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, bool>> load_done_ ABSL_GUARDED_BY(mu_);
};

class EngineFaultsTest : public ::testing::Test {
 protected:
  void Make(EngineOptions options = {}) {
    options.page_size = kP;
    options.kv_preset = "tiny-draft";
    // The daemon's policies, write-ahead's rounds inline: the tests count
    // what a call did once it returns (the round's own thread would run it
    // at any time).
    options.write_ahead_thread = false;
    if (options.device_pages_per_rank ==
        EngineOptions{}.device_pages_per_rank) {
      options.device_pages_per_rank = 32;
    }
    if (options.host_pages_per_rank == EngineOptions{}.host_pages_per_rank)
      options.host_pages_per_rank = 64;
    options.wrap_transfer = [this](TransferListener* listener,
                                   const TransferEngineFactory& backend) {
      auto faults = std::make_unique<FaultyTransferEngine>(listener, backend);
      faults_ = faults.get();
      return faults;
    };
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    engine_->SetListener(&listener_);
  }

  // Pages with the given owners, holding the KV of `tokens`.
  std::vector<LogicalPage> Compute(const std::vector<int32_t>& tokens,
                                   std::vector<Rank> owners = {}) {
    if (owners.empty()) owners.assign((tokens.size() + kP - 1) / kP, 0);
    auto pages = engine_->AllocateWithOwners(owners);
    EXPECT_TRUE(pages.ok()) << pages.status();
    WriteKv(*engine_, tokens, *pages, 0);
    return *pages;
  }

  // Backs `tokens` up per layer, inserts and attaches; returns the node.
  NodeId Cache(const std::vector<int32_t>& tokens,
               std::vector<Rank> owners = {}) {
    const std::vector<LogicalPage> pages = Compute(tokens, owners);
    auto ops = engine_->PrepareBackups(
        {BackupSpec{pages, static_cast<int64_t>(tokens.size())}});
    EXPECT_TRUE(ops.ok());
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      EXPECT_TRUE(engine_->LayerStored(*ops, s).ok());
    }
    auto inserted = engine_->Insert("", tokens, pages);
    EXPECT_TRUE(inserted.ok());
    EXPECT_TRUE(engine_->AttachBackup((*ops)[0], inserted->node).ok());
    engine_->WaitForTransfers();
    return inserted->node;
  }

  void EvictAllDevice() {
    ASSERT_TRUE(
        engine_
            ->EvictPages(
                std::vector<int64_t>(engine_->layout().cp_size(), 1 << 20), {})
            .ok());
  }

  // Load-back of `tokens` expected to succeed; verifies the bytes.
  LoadResult LoadAndVerify(const std::vector<int32_t>& tokens) {
    auto load = engine_->LoadBack("", tokens);
    EXPECT_TRUE(load.ok()) << load.status();
    engine_->WaitForTransfers();
    if (load->op_id != 0) {
      absl::StatusOr<bool> done = engine_->LoadDone(load->op_id);
      EXPECT_TRUE(done.ok() && *done) << done.status();
      EXPECT_TRUE(VerifyKv(*engine_, tokens, load->pages,
                           load->device_len + load->loaded_len)
                      .ok());
      EXPECT_TRUE(engine_->FinishLoad(load->op_id).ok());
    } else {
      EXPECT_TRUE(engine_->Unlock(load->node).ok());
    }
    return *load;
  }

  // Waits until the engine has processed `n` copy completions.
  void WaitForCompletions(int64_t n) {
    while (engine_->Stats().steps_completed < n) std::this_thread::yield();
  }

  void ExpectNoLeak() {
    engine_->WaitForTransfers();
    const absl::Status invariants = engine_->CheckInvariants();
    EXPECT_TRUE(invariants.ok()) << invariants;
    EXPECT_EQ(engine_->DeviceAllocatedPages(), engine_->TreeDevicePages());
  }

  RecordingListener listener_;
  std::unique_ptr<HiCacheEngine> engine_;
  FaultyTransferEngine* faults_ = nullptr;  // Owned by engine_.
};

// A per-layer backup whose step 1 fails on rank 1: never committed, the node
// stays device-only, nothing becomes host-matchable, the host pages are
// freed, and the scheduler hears the rollback.
TEST_F(EngineFaultsTest, BackupFailingOnOneRankIsNeverCommitted) {
  Make({.cp_size = 2});
  const std::vector<int32_t> tokens = Seq(0, 16);
  const std::vector<LogicalPage> pages = Compute(tokens, {0, 1, 0, 1});
  auto ops = engine_->PrepareBackups({BackupSpec{pages, 16}});
  ASSERT_TRUE(ops.ok());
  const uint64_t op = (*ops)[0];
  faults_->FailAt({.op_id = op, .direction = kD2H, .rank = 1, .step = 1});
  for (uint32_t s = 0; s < 3; ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->HostUsedPages(1), 0);
  auto inserted = engine_->Insert("", tokens, pages);
  ASSERT_TRUE(inserted.ok());
  EXPECT_EQ(engine_->AttachBackup(op, inserted->node).code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(engine_->RollbackBackup(op).ok());
  EXPECT_EQ(engine_->RollbackBackup(op).code(), absl::StatusCode::kNotFound);

  auto info = engine_->Inspect(inserted->node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tier, NodeTier::kDevice);
  EXPECT_FALSE(info->pending_backup);
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 0);
  listener_.AwaitRolledBack(op);
  EXPECT_THAT(listener_.rolled_back(), ElementsAre(op));
  EXPECT_THAT(listener_.committed(), IsEmpty());
  EXPECT_THAT(listener_.backup_steps(),
              Not(Contains(RecordingListener::Step{op, 1, 1})));
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.backups_failed, 1);
  EXPECT_EQ(stats.copy_failures, 1);
  EXPECT_EQ(stats.backups_committed, 0);
  ExpectNoLeak();
  // Without its device copy nothing of it is matchable.
  EvictAllDevice();
  auto match = engine_->Match("", tokens, /*peek=*/true);
  EXPECT_EQ(match->device_len, 0);
  EXPECT_EQ(match->host_hit_len, 0);
  ExpectNoLeak();
}

// A rank that owns none of the pages acks no-ops; its failure fails the
// backup all the same.
TEST_F(EngineFaultsTest, ZeroOwnedRankFailureFailsTheBackup) {
  Make({.cp_size = 4});
  const std::vector<LogicalPage> pages = Compute(Seq(0, 8), {2, 2});
  auto ops = engine_->PrepareBackups({BackupSpec{pages, 8}});
  faults_->FailAt({.op_id = (*ops)[0], .direction = kD2H, .rank = 0});
  ASSERT_TRUE(engine_->StoreAllLayers((*ops)[0]).ok());
  engine_->WaitForTransfers();
  auto inserted = engine_->Insert("", Seq(0, 8), pages);
  EXPECT_FALSE(engine_->AttachBackup((*ops)[0], inserted->node).ok());
  EXPECT_TRUE(engine_->RollbackBackup((*ops)[0]).ok());
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 0);
  EXPECT_EQ(engine_->HostUsedPages(2), 0);
  ExpectNoLeak();
}

// Attached before its layers are stored: the failure takes the pending
// backup off the node at once; the later LayerStored calls succeed without
// copying; a new backup of the node later commits with the right bytes.
TEST_F(EngineFaultsTest, AttachedBackupFailureAbortsThePendingBackup) {
  Make({.cp_size = 2, .write_policy = WritePolicy::kWriteThrough});
  const std::vector<int32_t> tokens = Seq(0, 12);
  const std::vector<LogicalPage> pages = Compute(tokens, {1, 0, 1});
  auto ops = engine_->PrepareBackups({BackupSpec{pages, 12}});
  const uint64_t op = (*ops)[0];
  auto inserted = engine_->Insert("", tokens, pages);
  ASSERT_TRUE(engine_->AttachBackup(op, inserted->node).ok());
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 1);
  faults_->FailAt({.op_id = op, .direction = kD2H, .rank = 0, .step = 0});
  ASSERT_TRUE(engine_->LayerStored(*ops, 0).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 0);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->HostUsedPages(1), 0);
  listener_.AwaitRolledBack(op);
  EXPECT_THAT(listener_.rolled_back(), ElementsAre(op));
  const int64_t completed = engine_->Stats().steps_completed;
  ASSERT_TRUE(engine_->LayerStored(*ops, 1).ok());
  ASSERT_TRUE(engine_->StoreAllLayers(op).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().steps_completed, completed);  // Nothing copied.
  // Every step stored and attached: the record is gone.
  EXPECT_EQ(engine_->RollbackBackup(op).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 0);
  EXPECT_THAT(listener_.committed(), IsEmpty());
  ExpectNoLeak();
  // The node is an ordinary device node again: write-through backs it up.
  ASSERT_EQ(engine_->Match("", tokens)->device_len, 12);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 12);
  EvictAllDevice();
  EXPECT_EQ(LoadAndVerify(tokens).loaded_len, 12);
  ExpectNoLeak();
}

// Bug: a late failure of a backup that had already failed aborted the node's
// pending backup again -- by then a newer backup's. That one then "committed"
// without host metadata (a kCommitted event for nothing) and leaked its host
// pages. Only the first failure of a live backup may touch the node.
TEST_F(EngineFaultsTest, LateFailureOfAFailedBackupLeavesTheNextOneAlone) {
  Make({.cp_size = 2, .write_policy = WritePolicy::kWriteThrough});
  const std::vector<int32_t> tokens = Seq(0, 8);
  const std::vector<LogicalPage> pages = Compute(tokens, {0, 1});
  ASSERT_TRUE(engine_->Insert("", tokens, pages).ok());
  // Backup A fails on both ranks at step 0; rank 1's completions are held
  // back so they arrive after backup B has begun.
  faults_->FailWhen(
      [](const TransferSite& s) { return s.direction == kD2H && s.step == 0; },
      {.times = 2});
  faults_->HoldWhen([](const TransferSite& s) { return s.rank == 1; });
  ASSERT_EQ(engine_->Match("", tokens)->device_len, 8);  // Starts A.
  WaitForCompletions(3);                                 // A, rank 0.
  while (faults_->held() < 3) std::this_thread::yield();
  EXPECT_EQ(engine_->Stats().backups_failed, 1);
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 0);
  ASSERT_EQ(engine_->Match("", tokens)->device_len, 8);  // Starts B.
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 1);
  WaitForCompletions(6);  // B, rank 0.
  while (faults_->held() < 6) std::this_thread::yield();
  faults_->HoldWhen(nullptr);
  EXPECT_EQ(faults_->ReleaseHeld(), 6);  // A's rank 1 first, then B's.
  engine_->WaitForTransfers();
  EXPECT_EQ(faults_->injected(), 2);
  EXPECT_EQ(engine_->Stats().backups_failed, 1);
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  listener_.Await([&] {
    return listener_.committed().size() + listener_.rolled_back().size() >= 2;
  });
  EXPECT_EQ(listener_.committed().size(), 1u);
  EXPECT_EQ(listener_.rolled_back().size(), 1u);
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  EXPECT_EQ(engine_->HostUsedPages(0), 1);
  EXPECT_EQ(engine_->HostUsedPages(1), 1);
  ExpectNoLeak();
  EvictAllDevice();
  EXPECT_EQ(LoadAndVerify(tokens).loaded_len, 8);
  ExpectNoLeak();
}

// Bug: a failed backup's record was erased as soon as its copies ended, so
// a LayerStored batch naming it failed NOT_FOUND and submitted nothing for
// the other backups of the batch, which then never committed.
TEST_F(EngineFaultsTest, LayerStoredBatchSurvivesAFailedBackup) {
  Make();
  const std::vector<int32_t> a = Seq(0, 8), b = Seq(100, 8);
  const std::vector<LogicalPage> pages_a = Compute(a), pages_b = Compute(b);
  auto ops =
      engine_->PrepareBackups({BackupSpec{pages_a, 8}, BackupSpec{pages_b, 8}});
  ASSERT_TRUE(ops.ok());
  faults_->FailAt({.op_id = (*ops)[0], .direction = kD2H});
  ASSERT_TRUE(engine_->LayerStored(*ops, 0).ok());
  engine_->WaitForTransfers();  // A has failed and its copies have ended.
  ASSERT_TRUE(engine_->LayerStored(*ops, 1).ok());
  ASSERT_TRUE(engine_->LayerStored(*ops, 2).ok());
  auto node_a = engine_->Insert("", a, pages_a);
  auto node_b = engine_->Insert("", b, pages_b);
  EXPECT_EQ(engine_->AttachBackup((*ops)[0], node_a->node).code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(engine_->RollbackBackup((*ops)[0]).ok());
  ASSERT_TRUE(engine_->AttachBackup((*ops)[1], node_b->node).ok());
  engine_->WaitForTransfers();
  listener_.AwaitCommitted((*ops)[1]);
  EXPECT_THAT(listener_.committed(), ElementsAre((*ops)[1]));
  EXPECT_THAT(listener_.rolled_back(), ElementsAre((*ops)[0]));
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  EvictAllDevice();
  EXPECT_EQ(LoadAndVerify(b).loaded_len, 8);
  auto miss = engine_->Match("", a, /*peek=*/true);
  EXPECT_EQ(miss->host_hit_len, 0);
  ExpectNoLeak();
}

// Bug: a failed load's record was erased when its copies ended, so LoadDone
// answered NOT_FOUND instead of ABORTED and FinishLoad failed. A failed load
// is a miss: ABORTED until FinishLoad, kLoadDone(ok = false), its pages freed at
// FinishLoad, the host copy kept (a retry loads the right bytes).
TEST_F(EngineFaultsTest, FailedLoadIsAMissUntilFinishLoad) {
  Make({.cp_size = 2});
  const std::vector<int32_t> tokens = Seq(0, 16);
  Cache(tokens, {0, 1, 1, 0});
  EvictAllDevice();
  ASSERT_EQ(engine_->DeviceAllocatedPages(), 0);
  faults_->FailWhen([](const TransferSite& s) {
    return s.direction == kH2D && s.rank == 1 && s.step == 2;
  });
  auto load = engine_->LoadBack("", tokens);
  ASSERT_TRUE(load.ok());
  ASSERT_NE(load->op_id, 0u);
  EXPECT_EQ(load->loaded_len, 16);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->LoadDone(load->op_id).status().code(),
            absl::StatusCode::kAborted);
  listener_.AwaitLoadDone(load->op_id);
  EXPECT_THAT(listener_.load_done(),
              ElementsAre(std::pair(load->op_id, false)));
  // The load's pages are the caller's until FinishLoad; never the tree's.
  EXPECT_EQ(engine_->DeviceAllocatedPages(), 4);
  EXPECT_EQ(engine_->TreeDevicePages(), 0);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  EXPECT_FALSE(engine_->Free(load->pages).ok());  // Not a request's pages.
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  EXPECT_EQ(engine_->LoadDone(load->op_id).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->DeviceAllocatedPages(), 0);
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.loads_failed, 1);
  EXPECT_EQ(stats.loads_done, 0);
  // The host copy is intact and still matchable.
  auto match = engine_->Match("", tokens, /*peek=*/true);
  EXPECT_EQ(match->device_len, 0);
  EXPECT_EQ(match->host_hit_len, 16);
  EXPECT_EQ(engine_->HostUsedPages(0) + engine_->HostUsedPages(1), 4);
  ExpectNoLeak();
  EXPECT_EQ(LoadAndVerify(tokens).loaded_len, 16);
  ExpectNoLeak();
}

// Bug: a failed load unlocked the device part of its hit when its copies
// ended, while the caller still used it (the hit's device prefix stays a
// valid hit after a failed load); eviction could take those pages from under
// the caller. The lock is the caller's until FinishLoad.
TEST_F(EngineFaultsTest, FailedLoadKeepsTheDevicePrefixLockedUntilFinishLoad) {
  Make();
  const std::vector<int32_t> prefix = Seq(0, 8), full = Seq(0, 16);
  Cache(prefix);  // Backed up: evictable to host if unlocked.
  // The rest of `full` as a child node, backed up, then evicted alone.
  auto hit = engine_->Match("", full);
  ASSERT_EQ(hit->device_len, 8);
  auto tail = engine_->Allocate(2);
  std::vector<LogicalPage> pages = hit->device_pages;
  pages.insert(pages.end(), tail->begin(), tail->end());
  WriteKv(*engine_, full, pages, 8);
  auto ops = engine_->PrepareBackups({BackupSpec{*tail, 8}});
  ASSERT_TRUE(engine_->StoreAllLayers((*ops)[0]).ok());
  auto child = engine_->Insert("", full, pages);
  ASSERT_TRUE(engine_->AttachBackup((*ops)[0], child->node).ok());
  engine_->WaitForTransfers();
  ASSERT_TRUE(engine_->EvictPages({2}, {}).ok());  // The leaf: the child.
  auto before = engine_->Match("", full, /*peek=*/true);
  ASSERT_EQ(before->device_len, 8);
  ASSERT_EQ(before->host_hit_len, 8);

  faults_->FailWhen([](const TransferSite& s) { return s.direction == kH2D; },
                    {.times = -1});
  auto load = engine_->LoadBack("", full);
  ASSERT_NE(load->op_id, 0u);
  EXPECT_EQ(load->device_len, 8);
  engine_->WaitForTransfers();  // The load has failed.
  // Pressure while the caller still holds its hit: the prefix stays.
  ASSERT_TRUE(engine_->EvictPages({1 << 20}, {}).ok());
  EXPECT_EQ(engine_->Match("", prefix, /*peek=*/true)->device_len, 8);
  EXPECT_TRUE(VerifyKv(*engine_, full, load->pages, load->device_len).ok());
  EXPECT_EQ(engine_->LoadDone(load->op_id).status().code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  ASSERT_TRUE(engine_->EvictPages({1 << 20}, {}).ok());
  EXPECT_EQ(engine_->Match("", prefix, /*peek=*/true)->device_len, 0);
  ExpectNoLeak();
}

// Bug: a failed completion still produced its per-layer event, telling a
// worker that a layer whose bytes never arrived was loaded (or stored).
TEST_F(EngineFaultsTest, FailedStepIsNeverAnnouncedAsLoaded) {
  Make();
  const std::vector<int32_t> tokens = Seq(0, 8);
  Cache(tokens);
  EvictAllDevice();
  faults_->FailWhen([](const TransferSite& s) { return s.step == 1; },
                    {.times = -1});
  auto load = engine_->LoadBack("", tokens);
  ASSERT_NE(load->op_id, 0u);
  engine_->WaitForTransfers();
  listener_.AwaitLoadDone(load->op_id);
  for (const auto& [op, rank, step] : listener_.load_steps()) {
    EXPECT_NE(step, 1u) << "a failed step was announced as loaded";
  }
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  // The same for a backup's steps.
  const std::vector<LogicalPage> pages = Compute(Seq(100, 4));
  auto ops = engine_->PrepareBackups({BackupSpec{pages, 4}});
  ASSERT_TRUE(engine_->StoreAllLayers((*ops)[0]).ok());
  engine_->WaitForTransfers();
  listener_.AwaitRolledBack((*ops)[0]);
  for (const auto& [op, rank, step] : listener_.backup_steps()) {
    if (op == (*ops)[0]) {
      EXPECT_NE(step, 1u);
    }
  }
  ASSERT_TRUE(engine_->RollbackBackup((*ops)[0]).ok());
  ASSERT_TRUE(engine_->Free(pages).ok());
  ExpectNoLeak();
}

// Write-back eviction stages the victim's copy; a failed copy drops the
// victim instead of moving it to host, and the host pages come back.
TEST_F(EngineFaultsTest, WriteBackCopyFailureDropsTheVictim) {
  Make({.device_pages_per_rank = 4, .write_policy = WritePolicy::kWriteBack});
  const std::vector<int32_t> tokens = Seq(0, 8);
  ASSERT_TRUE(engine_->Insert("", tokens, Compute(tokens)).ok());
  faults_->FailWhen([](const TransferSite& s) {
    return s.direction == TransferDirection::kDeviceToHost && s.step == 0;
  });
  auto room = engine_->Allocate(3);  // Forces the write-back eviction.
  ASSERT_TRUE(room.ok()) << room.status();
  ASSERT_TRUE(engine_->Free(*room).ok());
  EXPECT_EQ(engine_->Stats().write_back_backups, 0);
  EXPECT_EQ(engine_->Stats().copy_failures, 1);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  auto match = engine_->Match("", tokens, /*peek=*/true);
  EXPECT_EQ(match->device_len + match->host_hit_len, 0);
  ExpectNoLeak();
  // Without the fault the next victim moves to host with its bytes.
  ASSERT_TRUE(engine_->Insert("", tokens, Compute(tokens)).ok());
  room = engine_->Allocate(3);
  ASSERT_TRUE(room.ok());
  ASSERT_TRUE(engine_->Free(*room).ok());
  EXPECT_EQ(engine_->Stats().write_back_backups, 1);
  EXPECT_EQ(LoadAndVerify(tokens).loaded_len, 8);
  ExpectNoLeak();
}

// Write-back copies run outside the engine lock: while an allocation waits
// for its staged victim, other calls proceed, and the victim's device pages
// stay allocated until its copy has completed.
TEST_F(EngineFaultsTest, WriteBackWaitsForTheCopyWithoutTheLock) {
  Make({.device_pages_per_rank = 4, .write_policy = WritePolicy::kWriteBack});
  const std::vector<int32_t> tokens = Seq(0, 8);
  ASSERT_TRUE(engine_->Insert("", tokens, Compute(tokens)).ok());
  faults_->HoldWhen([](const TransferSite& s) {
    return s.direction == TransferDirection::kDeviceToHost;
  });
  absl::StatusOr<std::vector<LogicalPage>> room;
  std::thread writer([&] { room = engine_->Allocate(3); });
  while (faults_->held() == 0) absl::SleepFor(absl::Milliseconds(1));
  // The engine answers while the writer waits, and the victim is still on
  // the device: its pages are not free while its copy is held.
  EXPECT_EQ(engine_->TreeDevicePages(), 2);
  EXPECT_EQ(engine_->Stats().write_back_backups, 0);
  faults_->HoldWhen(nullptr);
  faults_->ReleaseHeld();
  writer.join();
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_EQ(engine_->Stats().write_back_backups, 1);
  EXPECT_EQ(engine_->TreeDevicePages(), 0);
  ASSERT_TRUE(engine_->Free(*room).ok());
  EXPECT_EQ(LoadAndVerify(tokens).loaded_len, 8);
  ExpectNoLeak();
}

}  // namespace
}  // namespace hicache
