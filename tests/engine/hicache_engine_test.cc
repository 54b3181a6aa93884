// One named test per seed scenario of the engine (docs/engine.md). Preset
// "tiny-draft" at P = 4: 2 target layers + 1 draft layer = 3 steps.
#include "daemon/engine/hicache_engine.h"

#include <atomic>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/mutex.h"
#include "daemon/transfer/transfer_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::VerifyKv;
using testing::WriteKv;

constexpr uint32_t kP = 4;

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class CountingListener : public EngineListener {
 public:
  void OnOpEvent(const OpEvent& e) override {
    MutexLock lock(&mu_);
    if (e.type == OpEvent::Type::kBackupStep) ++backup_steps_[e.rank];
    if (e.type == OpEvent::Type::kLoadStep) ++load_steps_[e.rank];
  }
  std::map<Rank, int> backup_steps() {
    MutexLock lock(&mu_);
    return backup_steps_;
  }
  std::map<Rank, int> load_steps() {
    MutexLock lock(&mu_);
    return load_steps_;
  }

 private:
  Mutex mu_;
  std::map<Rank, int> backup_steps_ ABSL_GUARDED_BY(mu_);
  std::map<Rank, int> load_steps_ ABSL_GUARDED_BY(mu_);
};

// Holds host-to-device copies (loads) while `hold` is set, so that a load
// stays in flight for as long as a test needs; everything else passes
// through to the backend's engine.
class HoldingTransferEngine : public TransferEngine {
 public:
  HoldingTransferEngine(TransferListener* listener,
                        const TransferEngineFactory& backend)
      : inner_(backend(listener)) {}
  ~HoldingTransferEngine() override { Release(); }

  void HoldLoads() {
    MutexLock lock(&mu_);
    hold_ = true;
  }
  // Submits the held copies and stops holding.
  void Release() {
    std::vector<TransferTask> held;
    {
      MutexLock lock(&mu_);
      hold_ = false;
      held.swap(held_);
    }
    for (TransferTask& task : held) {
      EXPECT_TRUE(inner_->Submit(std::move(task)).ok());
    }
  }
  int64_t held() {
    MutexLock lock(&mu_);
    return held_.size();
  }

  absl::Status Submit(TransferTask task) override {
    {
      MutexLock lock(&mu_);
      if (hold_ && task.direction == TransferDirection::kHostToDevice) {
        held_.push_back(std::move(task));
        return absl::OkStatus();
      }
    }
    return inner_->Submit(std::move(task));
  }
  void Drain() override {
    Release();
    inner_->Drain();
  }
  absl::StatusOr<uint64_t> RegisterFence(Rank rank,
                                         const std::string& handle) override {
    return inner_->RegisterFence(rank, handle);
  }
  absl::Status ReleaseFence(uint64_t fence) override {
    return inner_->ReleaseFence(fence);
  }
  absl::StatusOr<Rank> FenceRank(uint64_t fence) const override {
    return inner_->FenceRank(fence);
  }

 private:
  std::unique_ptr<TransferEngine> inner_;
  Mutex mu_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<TransferTask> held_ ABSL_GUARDED_BY(mu_);
};

class EngineTest : public ::testing::Test {
 protected:
  void Make(EngineOptions options = {}) {
    options.page_size = kP;
    options.kv_preset = "tiny-draft";
    // The daemon's policies, write-ahead's rounds inline: the tests count
    // what a call did once it returns (the round's own thread would run it
    // at any time).
    options.write_ahead_thread = false;
    if (options.device_pages_per_rank ==
        EngineOptions{}.device_pages_per_rank)
      options.device_pages_per_rank = 32;
    if (options.host_pages_per_rank == EngineOptions{}.host_pages_per_rank) options.host_pages_per_rank = 64;
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    engine_->SetListener(&listener_);
  }

  // Writes the request's KV into pages, backs it up per layer, inserts it
  // and attaches the backup. Returns the node.
  NodeId Cache(const std::vector<int32_t>& tokens,
               std::vector<Rank> owners = {}, bool store_all = true) {
    const int64_t pages_needed = (tokens.size() + kP - 1) / kP;
    if (owners.empty()) owners.assign(pages_needed, 0);
    auto pages = engine_->AllocateWithOwners(owners);
    EXPECT_TRUE(pages.ok()) << pages.status();
    WriteKv(*engine_, tokens, *pages, 0);
    auto ops = engine_->PrepareBackups(
        {BackupSpec{*pages, static_cast<int64_t>(tokens.size())}});
    EXPECT_TRUE(ops.ok());
    last_op_ = (*ops)[0];
    if (store_all) {
      for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
        EXPECT_TRUE(engine_->LayerStored(*ops, s).ok());
      }
    }
    auto inserted = engine_->Insert("", tokens, *pages);
    EXPECT_TRUE(inserted.ok());
    EXPECT_TRUE(engine_->AttachBackup(last_op_, inserted->node).ok());
    engine_->WaitForTransfers();
    return inserted->node;
  }

  void EvictAllDevice() {
    // Allocating every free page pushes everything evictable out; then free.
    const int64_t total = (engine_->options().device_pages_per_rank - 1) *
                          engine_->layout().cp_size();
    auto pages = engine_->Allocate(total);
    ASSERT_TRUE(pages.ok()) << pages.status();
    ASSERT_TRUE(engine_->Free(*pages).ok());
  }

  // Load-back of `tokens`, waits, verifies the bytes, releases the lock.
  LoadResult LoadAndVerify(const std::vector<int32_t>& tokens) {
    auto load = engine_->LoadBack("", tokens);
    EXPECT_TRUE(load.ok()) << load.status();
    engine_->WaitForTransfers();
    if (load->op_id != 0) {
      EXPECT_TRUE(*engine_->LoadDone(load->op_id));
      EXPECT_TRUE(VerifyKv(*engine_, tokens, load->pages,
                           load->device_len + load->loaded_len)
                      .ok());
      EXPECT_TRUE(engine_->FinishLoad(load->op_id).ok());
    } else {
      EXPECT_TRUE(engine_->Unlock(load->node).ok());
    }
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
    return *load;
  }

  CountingListener listener_;
  std::unique_ptr<HiCacheEngine> engine_;
  uint64_t last_op_ = 0;
};

TEST_F(EngineTest, WriteFilteredToOwnedPhysicalPages) {
  Make({.cp_size = 2});
  Cache(Seq(0, 12), {0, 1, 1});
  EXPECT_EQ(engine_->HostUsedPages(0), 1);
  EXPECT_EQ(engine_->HostUsedPages(1), 2);
  // Each rank copied only its own pages: 3 steps of one page on rank 0.
  const uint64_t bytes_per_page = engine_->geometry().BytesPerPage();
  EXPECT_EQ(engine_->Stats().bytes_to_host, 3 * bytes_per_page);
  EvictAllDevice();
  LoadResult load = LoadAndVerify(Seq(0, 12));
  EXPECT_EQ(load.loaded_len, 12);
}

// A daemon serving ranks {1, 3} of C = 4 has pools only for them, copies
// only for them, and completes an op on their acks; the tree and the lanes
// still cover all four ranks.
TEST_F(EngineTest, ServedRanksOnlyHavePoolsAndCopies) {
  Make({.cp_size = 4, .served_ranks = {1, 3}});
  for (Rank r : {0u, 2u}) {
    EXPECT_EQ(engine_->pools().device(r), nullptr);
    EXPECT_EQ(engine_->pools().host(r), nullptr);
  }
  for (Rank r : {1u, 3u}) {
    EXPECT_NE(engine_->pools().device(r), nullptr);
    EXPECT_NE(engine_->pools().host(r), nullptr);
  }
  const std::vector<int32_t> tokens = Seq(0, 16);
  Cache(tokens, {1, 3, 3, 1});
  const uint32_t steps = engine_->geometry().NumSteps();
  const std::map<Rank, int> expected{{1, static_cast<int>(steps)},
                                     {3, static_cast<int>(steps)}};
  EXPECT_EQ(listener_.backup_steps(), expected);
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  EXPECT_EQ(engine_->HostUsedPages(1), 2);
  EXPECT_EQ(engine_->HostUsedPages(3), 2);
  EvictAllDevice();
  const LoadResult load = LoadAndVerify(tokens);
  EXPECT_EQ(load.loaded_len, 16);
  EXPECT_EQ(listener_.load_steps(), expected);
}

// Pools that do not fit /dev/shm are refused before any memory is taken
// (a sparse segment would fault at first use instead).
TEST(EngineCapacityTest, RefusesPoolsLargerThanSharedMemory) {
  auto engine = HiCacheEngine::Create({.page_size = 64,
                                       .cp_size = 8,
                                       .kv_preset = "deepseek-v3.2-fp8",
                                       .device_pages_per_rank = 1 << 20,
                                       .host_pages_per_rank = 1 << 20});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(engine.status().message()),
              ::testing::HasSubstr("/dev/shm"));
}

TEST_F(EngineTest, ZeroOwnedRanksAckEveryStepWithNoOps) {
  Make({.cp_size = 4});
  Cache(Seq(0, 8), {2, 2});  // Ranks 0, 1, 3 own nothing.
  for (Rank r = 0; r < 4; ++r) {
    EXPECT_EQ(listener_.backup_steps()[r], 3) << "rank " << r;
  }
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  EvictAllDevice();
  LoadAndVerify(Seq(0, 8));
  for (Rank r = 0; r < 4; ++r) {
    EXPECT_EQ(listener_.load_steps()[r], 3) << "rank " << r;
  }
}

// Host admission counts physical pages of the rank that is short: victims
// with no page on that rank are skipped, and a victim counts only its pages
// on that rank, not its logical length.
TEST_F(EngineTest, WriteRetriesAfterHostEvictionByPhysicalPages) {
  Make({.cp_size = 4, .host_pages_per_rank = 4});
  const std::vector<int32_t> a = Seq(0, 16), b = Seq(100, 16), c = Seq(200, 16),
                             d = Seq(300, 8);
  Cache(a, {1, 1, 2, 2});  // Oldest (first victim); nothing on rank 0.
  Cache(b, {0, 3, 3, 3});  // 4 logical pages, 1 physical page on rank 0.
  Cache(c, {0, 0, 0, 1});  // Rank 0 is full now.
  Cache(d, {2, 3});        // Newest.
  EvictAllDevice();        // All host-only.
  ASSERT_EQ(engine_->HostUsedPages(0), 4);
  Cache(Seq(900, 8), {0, 0});  // Needs 2 physical pages on rank 0.
  EXPECT_EQ(engine_->Stats().backups_skipped_no_host, 0);
  EXPECT_EQ(engine_->Stats().backups_committed, 5);
  // a was skipped; b freed one rank-0 page, not enough, so c went too; d
  // was not needed.
  EXPECT_EQ(engine_->Stats().host_evicted_pages, 8);
  EXPECT_EQ(engine_->Match("", a, /*peek=*/true)->host_hit_len, 16);
  EXPECT_EQ(engine_->Match("", b, /*peek=*/true)->host_hit_len, 0);
  EXPECT_EQ(engine_->Match("", c, /*peek=*/true)->host_hit_len, 0);
  EXPECT_EQ(engine_->Match("", d, /*peek=*/true)->host_hit_len, 8);
  EXPECT_EQ(engine_->HostUsedPages(0), 2);  // The new backup.
  EXPECT_EQ(engine_->HostUsedPages(1), 2);  // a.
  EXPECT_EQ(engine_->HostUsedPages(2), 3);  // a, d.
  EXPECT_EQ(engine_->HostUsedPages(3), 1);  // d.
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

TEST_F(EngineTest, SplitAndEvictionKeepHostMetadata) {
  Make({.cp_size = 2});
  Cache(Seq(0, 16), {0, 1, 0, 1});
  // A request diverging at token 9 splits the backed node at page 8.
  std::vector<int32_t> other = Seq(0, 9);
  other.insert(other.end(), {500, 501, 502});
  auto hit = engine_->Match("", other);
  ASSERT_EQ(hit->device_len, 8);
  auto pages = engine_->AllocateWithOwners({1});
  std::vector<LogicalPage> all = hit->device_pages;
  all.push_back((*pages)[0]);
  WriteKv(*engine_, other, all, 8);
  ASSERT_TRUE(engine_->Insert("", other, all).ok());
  EvictAllDevice();
  EXPECT_EQ(LoadAndVerify(Seq(0, 16)).loaded_len, 16);
}

TEST_F(EngineTest, LoadBackUsesTheRecordedOwnerPattern) {
  Make({.cp_size = 4, .device_pages_per_rank = 16});
  const std::vector<Rank> zigzag = ZigzagComputeOwners(10, 4);
  const NodeId node = Cache(Seq(0, 40), zigzag);
  EvictAllDevice();
  LoadResult load = LoadAndVerify(Seq(0, 40));
  ASSERT_EQ(load.pages.size(), 10u);
  EXPECT_THAT(engine_->layout().OwnersOf(load.pages), ElementsAreArray(zigzag));
  (void)node;
}

// The load-back threshold compares the logical (valid-token) length of the
// host hit: not one rank's physical share, not the padded page span.
TEST_F(EngineTest, ThresholdOnLogicalLength) {
  Make({.cp_size = 4, .load_back_threshold_tokens = 31});
  const std::vector<Rank> round_robin = {0, 1, 2, 3, 0, 1, 2, 3};
  // 32 tokens: 8 per rank, 32 logical: loaded.
  Cache(Seq(0, 32), round_robin);
  // 30 valid tokens in 8 pages (32 padded): below the threshold.
  Cache(Seq(100, 30), round_robin);
  EvictAllDevice();
  const LoadResult below = LoadAndVerify(Seq(100, 30));
  EXPECT_EQ(below.miss, LoadMissReason::kBelowThreshold);
  EXPECT_EQ(below.op_id, 0u);
  EXPECT_EQ(below.loaded_len, 0);
  const LoadResult above = LoadAndVerify(Seq(0, 32));
  EXPECT_EQ(above.miss, LoadMissReason::kNone);
  EXPECT_NE(above.op_id, 0u);
  EXPECT_EQ(above.loaded_len, 32);
}

TEST_F(EngineTest, MemQuotaCountsEvictablePages) {
  Make({.device_pages_per_rank = 8});  // 7 usable pages.
  Cache(Seq(0, 16));                   // 4 pages, backed.
  EvictAllDevice();
  auto filler = engine_->Allocate(7);
  ASSERT_TRUE(filler.ok());
  WriteKv(*engine_, Seq(900, 28), *filler, 0);
  ASSERT_TRUE(engine_->Insert("", Seq(900, 28), *filler).ok());
  // Nothing is free, but 7 evictable pages cover the 4-page load.
  LoadResult load = LoadAndVerify(Seq(0, 16));
  EXPECT_EQ(load.miss, LoadMissReason::kNone);
  EXPECT_EQ(load.loaded_len, 16);
}

// A padded tail page is never handed out as if full (seeds 000 and 001: a
// load returns the node's valid length, and a non-page hit is floored): the
// scheduler's load (exact_tail = false) returns only pages whose tokens are
// all valid, whether the host node ends in a padded page or the request
// diverges inside one.
TEST_F(EngineTest, LoadReturnsOnlyWholeValidPages) {
  Make({.cp_size = 2});
  Cache(Seq(0, 10), {0, 1, 0});  // Page 2: 2 valid tokens and 2 of padding.
  Cache(Seq(100, 16), {0, 1, 0, 1});
  EvictAllDevice();
  std::vector<int32_t> diverging = Seq(100, 9);
  diverging.push_back(999);  // Diverges inside page 2.
  for (const std::vector<int32_t>& tokens : {Seq(0, 10), diverging}) {
    auto load = engine_->LoadBack("", tokens, {.exact_tail = false});
    ASSERT_TRUE(load.ok()) << load.status();
    ASSERT_NE(load->op_id, 0u);
    const int64_t valid = load->device_len + load->loaded_len;
    EXPECT_EQ(load->loaded_len, 8);
    EXPECT_EQ(static_cast<int64_t>(load->pages.size()) * kP, valid);
    engine_->WaitForTransfers();
    EXPECT_TRUE(*engine_->LoadDone(load->op_id));
    EXPECT_TRUE(VerifyKv(*engine_, tokens, load->pages, valid).ok());
    EXPECT_TRUE(engine_->FinishLoad(load->op_id).ok());
  }
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

// Seed 000: a load locks its own device prefix before it allocates, so the
// quota must not count that prefix as room. Before the fix the quota passed
// (2 free + 2 evictable = the 4 pages to load), the lock then pinned the 2
// evictable ones, and the load failed later, at allocation, as
// kNoDeviceMemory.
TEST_F(EngineTest, QuotaExcludesTheLoadsOwnDevicePrefix) {
  Make({.device_pages_per_rank = 8,
        .write_policy = WritePolicy::kWriteThroughSelective,
        .eviction_policy = EvictionPolicy::kLru});  // 7 usable pages.
  Cache(Seq(0, 24));  // 6 pages, backed up.
  auto head = engine_->Match("", Seq(0, 8), /*peek=*/false, /*lock=*/true);
  ASSERT_TRUE(head.ok());  // Splits [0, 8) | [8, 24).
  ASSERT_EQ(head->device_len, 8);
  auto held = engine_->Allocate(5);  // Evicts only the unlocked 4-page tail.
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(engine_->Free(absl::MakeConstSpan(*held).first(2)).ok());
  ASSERT_TRUE(engine_->Unlock(head->last_device_node).ok());
  // 2 free + 2 evictable (the head) = the 4 pages to load, but the head is
  // the load's own prefix.
  auto load = engine_->LoadBack("", Seq(0, 24));
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->miss, LoadMissReason::kOverQuota);
  EXPECT_EQ(load->op_id, 0u);
  EXPECT_EQ(load->device_len, 8);
  ASSERT_TRUE(engine_->Unlock(load->node).ok());
  ASSERT_TRUE(engine_->Free(absl::MakeConstSpan(*held).subspan(2)).ok());
  EXPECT_EQ(LoadAndVerify(Seq(0, 24)).loaded_len, 16);  // 5 free: it fits.
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

TEST_F(EngineTest, QuotaMissWhenNothingIsEvictable) {
  Make({.device_pages_per_rank = 8});
  Cache(Seq(0, 16));
  EvictAllDevice();
  auto held = engine_->Allocate(7);  // Request pages: not evictable.
  ASSERT_TRUE(held.ok());
  LoadResult load = LoadAndVerify(Seq(0, 16));
  EXPECT_EQ(load.miss, LoadMissReason::kOverQuota);
}

// Seed 000, Task 1: the load must leave room for its own request's extend
// (ceil(extend / P) + 1 pages); without the extend it fits.
TEST_F(EngineTest, LoadKeepsRoomForTheRequestsExtend) {
  Make({.device_pages_per_rank = 8});  // 7 usable pages.
  Cache(Seq(0, 16));                   // 4 pages, backed.
  EvictAllDevice();
  auto held = engine_->Allocate(2);  // 5 free: the load (4) fits.
  ASSERT_TRUE(held.ok());
  // An extend of 1 token needs 2 more pages: 4 + 2 > 5.
  auto tight = engine_->LoadBack("", Seq(0, 16), {.extend_tokens = 1});
  ASSERT_TRUE(tight.ok());
  EXPECT_EQ(tight->miss, LoadMissReason::kOverQuota);
  EXPECT_EQ(tight->op_id, 0u);
  ASSERT_TRUE(engine_->Free(*held).ok());  // 7 free: 4 + 2 fit.
  auto roomy = engine_->LoadBack("", Seq(0, 16), {.extend_tokens = 1});
  ASSERT_TRUE(roomy.ok());
  EXPECT_EQ(roomy->miss, LoadMissReason::kNone);
  EXPECT_NE(roomy->op_id, 0u);
  engine_->WaitForTransfers();
  ASSERT_TRUE(engine_->FinishLoad(roomy->op_id).ok());
  EXPECT_FALSE(engine_->LoadBack("", Seq(0, 16), {.extend_tokens = -1}).ok());
  EXPECT_TRUE(engine_->CheckInvariants().ok());
}

// A lane-0 shortage evicts lane-0 nodes only -- exactly the oldest one, which
// suffices -- although nodes of every other lane come first in LRU order and
// those lanes have free pages.
TEST_F(EngineTest, OwnerLaneTargetedEviction) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE(absl::StrCat("C = ", cp));
    Make({.cp_size = cp, .device_pages_per_rank = 4});  // 3 usable per lane.
    std::vector<std::vector<int32_t>> others;  // Oldest: one per other lane.
    for (Rank lane = 1; lane < cp; ++lane) {
      auto pages = engine_->AllocateWithOwners({lane});
      ASSERT_TRUE(pages.ok());
      others.push_back(Seq(1000 * lane, 4));
      ASSERT_TRUE(engine_->Insert("", others.back(), *pages).ok());
    }
    auto old0 = engine_->AllocateWithOwners({0, 0});
    ASSERT_TRUE(engine_->Insert("", Seq(0, 8), *old0).ok());
    auto new0 = engine_->AllocateWithOwners({0});
    ASSERT_TRUE(engine_->Insert("", Seq(50, 4), *new0).ok());
    ASSERT_EQ(engine_->DeviceAvailable(0), 0);  // Lane 0 full, others not.
    const int64_t evicted_before = engine_->Stats().device_evicted_pages;

    auto pages = engine_->AllocateWithOwners({0, 0});
    ASSERT_TRUE(pages.ok()) << pages.status();
    EXPECT_THAT(*pages, ::testing::UnorderedElementsAreArray(*old0));
    EXPECT_EQ(engine_->Stats().device_evicted_pages - evicted_before, 2);
    EXPECT_EQ(engine_->Match("", Seq(0, 8), /*peek=*/true)->device_len, 0);
    EXPECT_EQ(engine_->Match("", Seq(50, 4), /*peek=*/true)->device_len, 4);
    for (const std::vector<int32_t>& tokens : others) {
      EXPECT_EQ(engine_->Match("", tokens, /*peek=*/true)->device_len, 4);
    }
    for (Rank lane = 1; lane < cp; ++lane) {
      EXPECT_EQ(engine_->DeviceAvailable(lane), 2) << "lane " << lane;
    }
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }
}

// Seed 001 (owner-lane capacity): "small lane deficits despite large
// aggregate evictable capacity". The short lane's only tree page is an
// ancestor's; every evictable leaf is in lane 0. The allocation evicts the
// children to reach it (their lane-0 pages are the price) instead of failing.
TEST_F(EngineTest, ShortLaneEvictsChildrenToReachAnAncestor) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE(absl::StrCat("C = ", cp));
    Make({.cp_size = cp, .device_pages_per_rank = 4});  // 3 usable per lane.
    const Rank short_lane = cp - 1;
    auto ancestor = engine_->AllocateWithOwners({short_lane});
    ASSERT_TRUE(ancestor.ok());
    ASSERT_TRUE(engine_->Insert("", Seq(0, 4), *ancestor).ok());
    std::vector<LogicalPage> children;
    for (int i = 1; i <= 3; ++i) {  // Lane 0 full of the ancestor's children.
      auto child = engine_->AllocateWithOwners({0});
      ASSERT_TRUE(child.ok());
      std::vector<int32_t> tokens = Seq(0, 4);
      const std::vector<int32_t> tail = Seq(100 * i, 4);
      tokens.insert(tokens.end(), tail.begin(), tail.end());
      ASSERT_TRUE(
          engine_->Insert("", tokens, {(*ancestor)[0], (*child)[0]}).ok());
      children.push_back((*child)[0]);
    }
    // A running request holds the rest of the short lane.
    auto held = engine_->AllocateWithOwners({short_lane, short_lane});
    ASSERT_TRUE(held.ok());
    ASSERT_EQ(engine_->DeviceAvailable(short_lane), 0);
    ASSERT_EQ(engine_->DeviceAvailable(0), 0);
    // Plenty is evictable in aggregate (4 pages), but only through lane 0.
    EXPECT_EQ(engine_->TreeStatistics().evictable_tokens, 16);

    auto pages = engine_->AllocateWithOwners({short_lane});
    ASSERT_TRUE(pages.ok()) << pages.status();
    EXPECT_THAT(*pages, ElementsAreArray(*ancestor));  // The ancestor's page.
    EXPECT_EQ(engine_->DeviceAvailable(0), 3);         // The children's.
    EXPECT_EQ(engine_->Match("", Seq(0, 4), /*peek=*/true)->device_len, 0);
    EXPECT_EQ(engine_->TreeStatistics().device_tokens, 0);
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
    ASSERT_TRUE(engine_->Free(*pages).ok());
    ASSERT_TRUE(engine_->Free(*held).ok());
  }
}

// The same lane shortage with the ancestor's subtree locked: nothing can
// reach its page, so the allocation fails and evicts nothing.
TEST_F(EngineTest, ShortLaneNeverEvictsALockedSubtree) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE(absl::StrCat("C = ", cp));
    Make({.cp_size = cp, .device_pages_per_rank = 4});
    const Rank short_lane = cp - 1;
    auto ancestor = engine_->AllocateWithOwners({short_lane});
    ASSERT_TRUE(engine_->Insert("", Seq(0, 4), *ancestor).ok());
    auto child = engine_->AllocateWithOwners({0});
    std::vector<int32_t> tokens = Seq(0, 4);
    tokens.push_back(77);
    auto inserted = engine_->Insert("", tokens, {(*ancestor)[0], (*child)[0]});
    ASSERT_TRUE(inserted.ok());
    ASSERT_TRUE(engine_->Lock(inserted->node).ok());
    auto held = engine_->AllocateWithOwners({short_lane, short_lane});
    ASSERT_TRUE(held.ok());
    auto pages = engine_->AllocateWithOwners({short_lane});
    EXPECT_EQ(pages.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(pages.status().message(), HasSubstr("eviction freed 0 pages"));
    EXPECT_EQ(engine_->Match("", tokens, /*peek=*/true)->device_len, 5);
    ASSERT_TRUE(engine_->Unlock(inserted->node).ok());
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }
}

// Load-path miss kNoDeviceMemory: the quota passes (other lanes are free)
// but the recorded owner lane stays short after targeted eviction. The load
// is a miss -- never a plain allocation in other lanes -- and leaves the
// host copy intact and unreferenced: it loads once the lane has room.
TEST_F(EngineTest, LoadMissWhenTheOwnerLaneStaysShort) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE(absl::StrCat("C = ", cp));
    Make({.cp_size = cp, .device_pages_per_rank = 4});  // 3 usable per lane.
    const Rank lane = cp - 1;
    const std::vector<int32_t> tokens = Seq(0, 8);
    Cache(tokens, {lane, lane});
    EvictAllDevice();
    // Running requests hold the whole owner lane; nothing is evictable.
    auto held = engine_->AllocateWithOwners({lane, lane, lane});
    ASSERT_TRUE(held.ok());
    const EngineStats before = engine_->Stats();

    const LoadResult miss = LoadAndVerify(tokens);
    EXPECT_EQ(miss.miss, LoadMissReason::kNoDeviceMemory);
    EXPECT_EQ(miss.op_id, 0u);
    EXPECT_EQ(miss.loaded_len, 0);
    EXPECT_TRUE(miss.pages.empty());
    const EngineStats after = engine_->Stats();
    EXPECT_EQ(after.load_misses - before.load_misses, 1);
    EXPECT_EQ(after.loads_started, before.loads_started);
    for (Rank l = 0; l < cp; ++l) {
      if (l != lane) EXPECT_EQ(engine_->DeviceAvailable(l), 3) << "lane " << l;
    }
    const NodeInfo node = *engine_->Inspect(
        engine_->Match("", tokens, /*peek=*/true)->last_host_node);
    EXPECT_EQ(node.tier, NodeTier::kHost);
    EXPECT_EQ(node.host_ref, 0);
    EXPECT_EQ(engine_->Match("", tokens, /*peek=*/true)->host_hit_len, 8);

    ASSERT_TRUE(engine_->Free(*held).ok());
    const LoadResult loaded = LoadAndVerify(tokens);
    EXPECT_EQ(loaded.miss, LoadMissReason::kNone);
    EXPECT_EQ(loaded.loaded_len, 8);
    EXPECT_THAT(engine_->layout().OwnersOf(loaded.pages),
                ElementsAre(lane, lane));
  }
}

// Load-path miss kLoadInFlight: a second load of nodes that a first load is
// still copying is a miss (it neither waits nor loads twice); the first
// completes normally and the hit is then on device.
TEST_F(EngineTest, ConcurrentLoadOfTheSameNodesIsAMiss) {
  HoldingTransferEngine* holding = nullptr;
  Make({.cp_size = 2,
        .wrap_transfer = [&holding](TransferListener* listener,
                                    const TransferEngineFactory& backend) {
          auto engine =
              std::make_unique<HoldingTransferEngine>(listener, backend);
          holding = engine.get();
          return engine;
        }});
  ASSERT_NE(holding, nullptr);
  const std::vector<int32_t> tokens = Seq(0, 16);
  const std::vector<int32_t> prefix = Seq(0, 8);
  Cache(tokens, {0, 1, 1, 0});
  // A request diverging at token 8 splits the backed node: once evicted,
  // the hit is a chain of two host-only nodes.
  std::vector<int32_t> other = prefix;
  other.insert(other.end(), {500, 501, 502, 503});
  auto hit = engine_->Match("", other, /*peek=*/true);
  ASSERT_EQ(hit->device_len, 8);
  auto page = engine_->AllocateWithOwners({0});
  std::vector<LogicalPage> pages = hit->device_pages;
  pages.push_back((*page)[0]);
  ASSERT_TRUE(engine_->Insert("", other, pages).ok());
  EvictAllDevice();
  ASSERT_EQ(engine_->TreeStatistics().host_tokens, 16);

  holding->HoldLoads();
  auto first = engine_->LoadBack("", tokens);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(first->op_id, 0u);
  EXPECT_EQ(first->loaded_len, 16);
  EXPECT_GT(holding->held(), 0);
  EXPECT_FALSE(*engine_->LoadDone(first->op_id));

  const int64_t misses = engine_->Stats().load_misses;
  // The same nodes, and a request needing only the first of them.
  for (const std::vector<int32_t>* query : {&tokens, &prefix}) {
    auto second = engine_->LoadBack("", *query);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(second->miss, LoadMissReason::kLoadInFlight);
    EXPECT_EQ(second->op_id, 0u);
    EXPECT_EQ(second->loaded_len, 0);
    EXPECT_TRUE(second->pages.empty());
    ASSERT_TRUE(engine_->Unlock(second->node).ok());
  }
  EXPECT_EQ(engine_->Stats().load_misses - misses, 2);
  EXPECT_EQ(engine_->Stats().loads_started, 1);

  holding->Release();
  engine_->WaitForTransfers();
  ASSERT_TRUE(*engine_->LoadDone(first->op_id));
  EXPECT_TRUE(VerifyKv(*engine_, tokens, first->pages, 16).ok());
  ASSERT_TRUE(engine_->FinishLoad(first->op_id).ok());
  // Loaded once: now a device hit, nothing more to load.
  const LoadResult again = LoadAndVerify(tokens);
  EXPECT_EQ(again.device_len, 16);
  EXPECT_EQ(again.op_id, 0u);
  EXPECT_EQ(engine_->Stats().loads_started, 1);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

// L2 free-room target: host pressure on a rank evicts down to
// l2_free_room_pages free pages there (not just the deficit), oldest first,
// and touches no other rank; EnforceFreeRoom applies a new target to every
// rank.
// LRU and write-through by name: the test counts which nodes go, oldest
// first (the default pair orders host victims by frequency class, and drops
// a redundant copy, such as the newest node's, before any host-only node).
TEST_F(EngineTest, L2FreeRoomTargetIsReached) {
  Make({.cp_size = 2,
        .host_pages_per_rank = 8,
        .write_policy = WritePolicy::kWriteThroughSelective,
        .eviction_policy = EvictionPolicy::kLru,
        .l2_free_room_pages = 3});
  auto tokens_of = [](Rank r, int i) { return Seq(1000 * r + 10 * i, 4); };
  for (Rank r = 0; r < 2; ++r) {
    for (int i = 0; i < 8; ++i) Cache(tokens_of(r, i), {r});
  }
  EvictAllDevice();  // Both host pools full of one-page host-only nodes.
  ASSERT_EQ(engine_->HostUsedPages(0), 8);
  ASSERT_EQ(engine_->HostUsedPages(1), 8);
  ASSERT_EQ(engine_->Stats().host_evicted_pages, 0);

  Cache(Seq(5000, 4), {0});  // Short by 1 on rank 0: evict 1 + 3.
  EXPECT_EQ(engine_->Stats().backups_committed, 17);
  EXPECT_EQ(engine_->Stats().host_evicted_pages, 4);
  EXPECT_EQ(engine_->HostUsedPages(0), 8 - 4 + 1);  // 3 free: the target.
  EXPECT_EQ(engine_->HostUsedPages(1), 8);          // Not short: untouched.
  auto host_hit = [&](Rank r, int i) {
    return engine_->Match("", tokens_of(r, i), /*peek=*/true)->host_hit_len;
  };
  for (int i = 0; i < 8; ++i) EXPECT_EQ(host_hit(0, i), i < 4 ? 0 : 4) << i;

  ASSERT_TRUE(engine_->SetFreeRoom(0, 5).ok());
  ASSERT_TRUE(engine_->EnforceFreeRoom().ok());
  EXPECT_EQ(engine_->HostUsedPages(0), 3);
  EXPECT_EQ(engine_->HostUsedPages(1), 3);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(host_hit(0, i), i < 6 ? 0 : 4) << i;
  for (int i = 0; i < 8; ++i) EXPECT_EQ(host_hit(1, i), i < 5 ? 0 : 4) << i;
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

TEST_F(EngineTest, PendingBackupIsInvisibleToMatch) {
  Make();
  Cache(Seq(0, 8), {}, /*store_all=*/false);  // Attached, nothing copied.
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 1);
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 0);
  const uint64_t ops[] = {last_op_};
  ASSERT_TRUE(engine_->LayerStored(ops, 0).ok());
  ASSERT_TRUE(engine_->LayerStored(ops, 1).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 0);  // Draft step missing.
  ASSERT_TRUE(engine_->LayerStored(ops, 2).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  EXPECT_EQ(engine_->TreeStatistics().pending_backups, 0);
}

TEST_F(EngineTest, ReadyAckIsHeldUntilAttach) {
  Make();
  auto pages = engine_->Allocate(2);
  WriteKv(*engine_, Seq(0, 8), *pages, 0);
  auto ops = *engine_->PrepareBackups({BackupSpec{*pages, 8}});
  ASSERT_TRUE(engine_->StoreAllLayers(ops[0]).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 0);  // Ready, not attached.
  auto inserted = engine_->Insert("", Seq(0, 8), *pages);
  ASSERT_TRUE(engine_->AttachBackup(ops[0], inserted->node).ok());
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  EXPECT_EQ(engine_->Stats().fallback_backups, 1);
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
}

TEST_F(EngineTest, RollbackRemovesOrphanAck) {
  Make();
  auto pages = engine_->Allocate(2);
  auto ops = *engine_->PrepareBackups({BackupSpec{*pages, 8}});
  ASSERT_TRUE(engine_->StoreAllLayers(ops[0]).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->HostUsedPages(0), 2);
  ASSERT_TRUE(engine_->RollbackBackup(ops[0]).ok());
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->AttachBackup(ops[0], 1).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->Free(*pages).ok());
  EXPECT_TRUE(engine_->CheckInvariants().ok());
}

TEST_F(EngineTest, DeferredInsertIsNonMutating) {
  Make();
  Cache(Seq(0, 12), {}, /*store_all=*/false);  // Pending backup.
  const TreeStats before = engine_->TreeStatistics();
  std::vector<int32_t> other = Seq(0, 8);
  other.insert(other.end(), {70, 71, 72, 73});
  auto pages = engine_->Allocate(3);
  auto result = engine_->Insert("", other, *pages);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->deferred);
  const TreeStats after = engine_->TreeStatistics();
  EXPECT_EQ(after.nodes, before.nodes);
  EXPECT_EQ(after.device_tokens, before.device_tokens);
  EXPECT_TRUE(engine_->Free(*pages).ok());  // Still the request's pages.
  EXPECT_TRUE(engine_->CheckInvariants().ok());
}

TEST_F(EngineTest, ChunkedMiddleChunkCachesCompletePagesOnly) {
  Make();
  auto pages = engine_->Allocate(3);
  WriteKv(*engine_, Seq(0, 10), *pages, 0);
  // The middle chunk backs up and inserts only its 2 complete pages.
  std::vector<LogicalPage> complete(pages->begin(), pages->begin() + 2);
  auto ops = *engine_->PrepareBackups({BackupSpec{complete, 8}});
  ASSERT_TRUE(engine_->StoreAllLayers(ops[0]).ok());
  auto inserted = engine_->Insert("", Seq(0, 10), *pages, {.unfinished = true});
  ASSERT_TRUE(inserted.ok());
  EXPECT_EQ(inserted->cached_len, 8);
  EXPECT_THAT(inserted->uncached_pages, ElementsAreArray({(*pages)[2]}));
  ASSERT_TRUE(engine_->AttachBackup(ops[0], inserted->node).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  EXPECT_TRUE(engine_->Free({(*pages)[2]}).ok());  // The request's tail.
}

TEST_F(EngineTest, DraftIsCommittedInLockstepWithTarget) {
  Make();
  ASSERT_EQ(engine_->geometry().NumSteps(), 3u);
  ASSERT_EQ(engine_->geometry().TargetSteps(), 2u);
  Cache(Seq(0, 8), {}, /*store_all=*/false);
  const uint64_t ops[] = {last_op_};
  ASSERT_TRUE(engine_->LayerStored(ops, 2).ok());  // Draft only.
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 0);
  ASSERT_TRUE(engine_->LayerStored(ops, 0).ok());
  ASSERT_TRUE(engine_->LayerStored(ops, 1).ok());
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  // Both payloads share the host page: one reservation, loaded together.
  EXPECT_EQ(engine_->HostUsedPages(0), 2);
  EvictAllDevice();
  LoadAndVerify(Seq(0, 8));  // Verifies target and draft bytes.
}

// Batch admission sums the host pages of every spec per rank and runs one
// eviction step that frees exactly that much on each rank (no free room):
// every spec is admitted, and a rank no spec needs loses nothing.
TEST_F(EngineTest, BatchAdmissionEvictsOnce) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE(absl::StrCat("C = ", cp));
    Make({.cp_size = cp, .host_pages_per_rank = 4});
    for (Rank r = 0; r < cp; ++r) {
      for (int i = 0; i < 4; ++i) Cache(Seq(1000 * r + 10 * i, 4), {r});
    }
    EvictAllDevice();  // Every host pool full of one-page host-only nodes.
    for (Rank r = 0; r < cp; ++r) ASSERT_EQ(engine_->HostUsedPages(r), 4);
    const EngineStats before = engine_->Stats();
    // Rank 0 needs 2 pages, rank 1 one, and at C = 4 rank 3 one; rank 2
    // none.
    std::vector<Rank> lanes = {0, 1, 0};
    if (cp == 4) lanes.push_back(3);
    std::vector<BackupSpec> specs;
    for (Rank lane : lanes) {
      auto pages = engine_->AllocateWithOwners({lane});
      ASSERT_TRUE(pages.ok());
      specs.push_back(BackupSpec{*pages, 4});
    }
    auto ops = engine_->PrepareBackups(specs);
    ASSERT_TRUE(ops.ok());
    for (uint64_t op : *ops) EXPECT_NE(op, 0u);
    const EngineStats after = engine_->Stats();
    EXPECT_EQ(after.host_eviction_steps - before.host_eviction_steps, 1);
    EXPECT_EQ(after.host_evicted_pages - before.host_evicted_pages,
              static_cast<int64_t>(lanes.size()));
    EXPECT_EQ(after.backups_skipped_no_host, 0);
    // Each rank freed what it reserved: all still full.
    for (Rank r = 0; r < cp; ++r) {
      EXPECT_EQ(engine_->HostUsedPages(r), 4) << "rank " << r;
    }
    if (cp == 4) {  // Rank 2's nodes are all still there.
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(engine_->Match("", Seq(2000 + 10 * i, 4), /*peek=*/true)
                      ->host_hit_len,
                  4);
      }
    }
    for (uint64_t op : *ops) ASSERT_TRUE(engine_->RollbackBackup(op).ok());
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }
}

TEST_F(EngineTest, FreeRoomTargetIsReached) {
  Make({.device_pages_per_rank = 16, .l1_free_room_pages = 5});
  for (int i = 0; i < 7; ++i) Cache(Seq(i * 100, 8));  // 14 of 15 pages.
  ASSERT_EQ(engine_->DeviceAvailable(0), 1);
  auto pages = engine_->Allocate(3);  // Short by 2: evict 2 + 5 free room.
  ASSERT_TRUE(pages.ok());
  EXPECT_GE(engine_->DeviceAvailable(0), 5);
  ASSERT_TRUE(engine_->EnforceFreeRoom().ok());
  EXPECT_GE(engine_->DeviceAvailable(0), 5);
}

TEST_F(EngineTest, FreeRefusesPagesTheTreeHolds) {
  Make();
  auto pages = engine_->Allocate(2);
  ASSERT_TRUE(engine_->Insert("", Seq(0, 8), *pages).ok());
  absl::Status freed = engine_->Free({(*pages)[0]});
  EXPECT_EQ(freed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(freed.message(), HasSubstr("held by the radix tree"));
}

TEST_F(EngineTest, OutOfMemoryMessageCarriesAccounting) {
  Make({.device_pages_per_rank = 4});
  auto held = engine_->Allocate(3);
  auto more = engine_->Allocate(1);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(), HasSubstr("device available=0"));
  EXPECT_THAT(more.status().message(), HasSubstr("eviction freed 0 pages"));
}

TEST_F(EngineTest, WriteThroughBacksUpAtFirstHit) {
  Make({.write_policy = WritePolicy::kWriteThrough});
  auto pages = engine_->Allocate(2);
  WriteKv(*engine_, Seq(0, 8), *pages, 0);
  ASSERT_TRUE(engine_->Insert("", Seq(0, 8), *pages).ok());
  ASSERT_EQ(engine_->Match("", Seq(0, 8))->device_len, 8);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  EvictAllDevice();
  LoadAndVerify(Seq(0, 8));
}

TEST_F(EngineTest, WriteBackBacksUpOnEviction) {
  Make({.device_pages_per_rank = 4, .write_policy = WritePolicy::kWriteBack});
  auto pages = engine_->Allocate(2);
  WriteKv(*engine_, Seq(0, 8), *pages, 0);
  ASSERT_TRUE(engine_->Insert("", Seq(0, 8), *pages).ok());
  EvictAllDevice();
  EXPECT_EQ(engine_->Stats().write_back_backups, 1);
  EXPECT_EQ(LoadAndVerify(Seq(0, 8)).loaded_len, 8);
}

}  // namespace
}  // namespace hicache
