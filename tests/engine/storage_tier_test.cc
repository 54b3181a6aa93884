// The storage tier (L3) under the daemon's default policies (write_ahead +
// tinylfu): byte integrity through L1 -> L2 -> L3 and back at C = 1, 2, 4
// and 8 with the host tier under pressure, with injected I/O errors, torn
// writes and flipped bits (misses, never a wrong byte, nothing leaked), a
// store shared by every rank, a restart on the same store files, several
// scheduler threads at once, and the configurations the engine refuses.
#include <map>
#include <memory>
#include <vector>

#include "daemon/core/clock.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/storage/faulty_block_io.h"
#include "daemon/storage/file_page_store.h"
#include "gtest/gtest.h"
#include "tests/engine/request_driver.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using Driver = testing::RequestDriver;

constexpr uint32_t kP = Driver::kPageSize;
constexpr const char* kPreset = "tiny-draft";

struct Stores {
  std::vector<std::unique_ptr<FilePageStore>> owned;
  std::vector<PageStore*> per_rank;
};

// One file store per rank (or one for all with `shared`), in `dir`.
Stores OpenStores(const std::string& dir, uint32_t cp, bool shared,
                  BlockIoFaults faults = {}, int64_t pages = 4096) {
  const KvGeometry g = *KvGeometry::Preset(kPreset, kP);
  Stores s;
  for (uint32_t r = 0; r < (shared ? 1 : cp); ++r) {
    FilePageStoreOptions o;
    o.directory = dir;
    o.name = absl::StrCat("rank", r);
    o.page_bytes = static_cast<int64_t>(g.BytesPerPage());
    o.capacity_pages = pages;
    o.queue_depth = 8;
    o.wrap_io =
        [faults](std::unique_ptr<BlockIo> inner) -> std::unique_ptr<BlockIo> {
      return std::make_unique<FaultyBlockIo>(std::move(inner), faults);
    };
    auto store = FilePageStore::Open(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return s;
    s.owned.push_back(*std::move(store));
  }
  for (uint32_t r = 0; r < cp; ++r) {
    s.per_rank.push_back(s.owned[shared ? 0 : r].get());
  }
  return s;
}

// The daemon's defaults but small pools: the host tier overflows into L3.
absl::StatusOr<std::unique_ptr<HiCacheEngine>> MakeEngine(
    uint32_t cp, const std::vector<PageStore*>& storage,
    const Clock* clock = nullptr,
    // The cost model off: these tests check bytes, and the model's
    // decisions follow the measured (real) read time.
    int64_t recompute_ns_per_token = 0) {
  EngineOptions o;
  o.clock = clock;
  o.storage_recompute_ns_per_token = recompute_ns_per_token;
  o.page_size = kP;
  o.cp_size = cp;
  o.kv_preset = kPreset;
  o.device_pages_per_rank = 1 + 48 / cp;
  o.host_pages_per_rank = 1 + 64 / cp;
  o.l1_free_room_pages = 1;
  o.l2_free_room_pages = 1;
  o.write_ahead_thread = false;
  o.storage = storage;
  return HiCacheEngine::Create(o);
}

void Drive(HiCacheEngine& engine, Driver& driver, int requests) {
  for (int step = 0; step < requests; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    engine.storage()->Flush();
    const absl::Status invariants = engine.CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  engine.WaitForTransfers();
  engine.storage()->Flush();
  ASSERT_TRUE(engine.CheckInvariants().ok());
  EXPECT_EQ(engine.DeviceAllocatedPages(), engine.TreeDevicePages());
}

struct Case {
  uint32_t cp;
  bool shared;
  bool faults;
};

class StorageTierIntegrityTest : public ::testing::TestWithParam<Case> {};

TEST_P(StorageTierIntegrityTest, EveryHitHasTheBytesThatWereWritten) {
  const Case c = GetParam();
  ASSERT_EQ(DaemonConfig::kDefaultWritePolicy, WritePolicy::kWriteAhead);
  testing::TempDir dir;
  BlockIoFaults faults;
  if (c.faults) {
    faults = {.fail_write_every = 11,
              .fail_read_every = 13,
              .tear_write_every = 7,
              .flip_read_every = 5};
  }
  Stores stores = OpenStores(dir.Child("l3"), c.cp, c.shared, faults);
  ASSERT_EQ(stores.per_rank.size(), c.cp);
  auto engine = MakeEngine(c.cp, stores.per_rank);
  ASSERT_TRUE(engine.ok()) << engine.status();
  Driver driver(engine->get(), 500 + c.cp, "");
  ASSERT_NO_FATAL_FAILURE(Drive(**engine, driver, 1500));
  const EngineStats stats = (*engine)->Stats();
  EXPECT_GT(driver.hits(), 0);
  EXPECT_GT(stats.storage_promoted_pages, 0)
      << "the host tier never overflowed into the storage tier";
  const StorageTier::Stats tier = (*engine)->storage()->stats();
  EXPECT_GT(tier.pages_written, 0);
  if (c.faults) {
    // Failed, torn and flipped pages were misses (the driver saw no wrong
    // byte) and the stores counted them.
    EXPECT_GT(tier.read_failures, 0);
    EXPECT_GT((*engine)->storage()->StoreStats().checksum_failures, 0);
  }
  for (const auto& store : stores.owned) {
    EXPECT_TRUE(store->CheckInvariants().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, StorageTierIntegrityTest,
    ::testing::Values(Case{1, false, false}, Case{2, false, false},
                      Case{4, false, false}, Case{8, false, false},
                      Case{1, false, true}, Case{2, false, true},
                      Case{4, false, true}, Case{8, false, true},
                      Case{2, true, false}, Case{4, true, true}),
    [](const auto& info) {
      return absl::StrCat("C", info.param.cp,
                          info.param.shared ? "Shared" : "PerRank",
                          info.param.faults ? "Faults" : "");
    });

// A new engine on the same store files (a restart, or an upgrade that
// keeps the layout) serves the previous engine's pages: the same requests
// hit in L3 with the bytes that were written.
TEST(StorageTierRestartTest, ANewEngineServesTheStoredPages) {
  testing::TempDir dir;
  for (const uint32_t cp : {1u, 2u}) {
    SCOPED_TRACE(absl::StrCat("C = ", cp));
    const std::string path = dir.Child(absl::StrCat("l3-", cp));
    {
      Stores stores = OpenStores(path, cp, false);
      auto engine = MakeEngine(cp, stores.per_rank);
      ASSERT_TRUE(engine.ok()) << engine.status();
      Driver driver(engine->get(), 77, "");
      ASSERT_NO_FATAL_FAILURE(Drive(**engine, driver, 300));
    }
    Stores stores = OpenStores(path, cp, false);
    EXPECT_GT(stores.owned[0]->open_report().entries, 0);
    auto engine = MakeEngine(cp, stores.per_rank);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Driver driver(engine->get(), 77, "");
    ASSERT_NO_FATAL_FAILURE(Drive(**engine, driver, 100));
    EXPECT_GT((*engine)->Stats().storage_promoted_pages, 0);
    EXPECT_GT(driver.counts().verified, 0);
  }
}

// Scheduler threads at once (run under --config=tsan too): promotions
// release the engine lock for their reads while others change the tree.
TEST(StorageTierConcurrencyTest, ManyThreadsOneEngine) {
  testing::TempDir dir;
  Stores stores = OpenStores(dir.Child("l3"), 2, false);
  auto engine = MakeEngine(2, stores.per_rank);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const testing::ConcurrentDrive drive =
      testing::DriveConcurrently(engine->get(), 9, 400, 4);
  EXPECT_EQ(drive.failed_threads, 0);
  (*engine)->WaitForTransfers();
  (*engine)->storage()->Flush();
  EXPECT_TRUE((*engine)->CheckInvariants().ok());
  EXPECT_EQ((*engine)->DeviceAllocatedPages(), (*engine)->TreeDevicePages());
}

// A device as slow as we like: every batch of I/O advances a fake clock by
// `per_batch` before it is submitted, so the engine measures that cost.
class SlowBlockIo final : public BlockIo {
 public:
  SlowBlockIo(std::unique_ptr<BlockIo> inner, FakeClock* clock,
              absl::Duration per_batch)
      : inner_(std::move(inner)), clock_(clock), per_batch_(per_batch) {}
  void Submit(std::vector<BlockIoOp> ops, BlockIoDone done) override {
    clock_->Advance(per_batch_);
    inner_->Submit(std::move(ops), std::move(done));
  }
  std::string Describe() const override { return "slow"; }

 private:
  std::unique_ptr<BlockIo> inner_;
  FakeClock* clock_;
  absl::Duration per_batch_;
};

// The cost model: once a read has shown the storage tier to be slower than
// recomputing (here 1 s per read against 1 us per token), promotions are
// refused and counted; with the cost model off they go on.
TEST(StorageTierCostModelTest, LoadsSlowerThanRecomputeAreRefused) {
  std::map<int64_t, int64_t> promoted;  // By recompute cost.
  for (const int64_t recompute : {int64_t{1000}, int64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("recompute ", recompute, " ns/token"));
    testing::TempDir dir;
    FakeClock clock;
    const KvGeometry g = *KvGeometry::Preset(kPreset, kP);
    FilePageStoreOptions o;
    o.directory = dir.Child("l3");
    o.page_bytes = static_cast<int64_t>(g.BytesPerPage());
    o.capacity_pages = 4096;
    o.wrap_io =
        [&clock](std::unique_ptr<BlockIo> inner) -> std::unique_ptr<BlockIo> {
      return std::make_unique<SlowBlockIo>(std::move(inner), &clock,
                                           absl::Seconds(1));
    };
    auto store = FilePageStore::Open(std::move(o));
    ASSERT_TRUE(store.ok()) << store.status();
    auto engine = MakeEngine(1, {store->get()}, &clock, recompute);
    ASSERT_TRUE(engine.ok()) << engine.status();
    Driver driver(engine->get(), 31, "");
    ASSERT_NO_FATAL_FAILURE(Drive(**engine, driver, 1500));
    const EngineStats stats = (*engine)->Stats();
    // At least one read went ahead (the cost was unknown) and measured it.
    const StorageTier::Stats tier = (*engine)->storage()->stats();
    EXPECT_GT(tier.pages_read + tier.read_failures, 0);
    EXPECT_GT((*engine)->storage()->ReadNsPerByte(), 1000.0);
    if (recompute > 0) {
      EXPECT_GT(stats.storage_refused_cost, 0);
    } else {
      EXPECT_EQ(stats.storage_refused_cost, 0);
      EXPECT_GT(stats.storage_promoted_pages, 0);
    }
    promoted[recompute] = stats.storage_promoted_pages;
  }
  EXPECT_LT(promoted[1000], promoted[0]);
}

// Holds every read until Release(); writes pass (a device whose reads are
// as slow as the test says).
class GatedBlockIo final : public BlockIo {
 public:
  explicit GatedBlockIo(std::unique_ptr<BlockIo> inner)
      : inner_(std::move(inner)) {}
  void Submit(std::vector<BlockIoOp> ops, BlockIoDone done) override {
    const bool reads = !ops.empty() && ops[0].kind == BlockIoOp::Kind::kRead;
    {
      MutexLock lock(&mu_);
      if (reads && !open_) {
        held_.push_back({std::move(ops), std::move(done)});
        return;
      }
    }
    inner_->Submit(std::move(ops), std::move(done));
  }
  std::string Describe() const override { return "gated"; }
  // Lets the held reads and every later one through.
  void Release() {
    std::vector<std::pair<std::vector<BlockIoOp>, BlockIoDone>> held;
    {
      MutexLock lock(&mu_);
      open_ = true;
      held.swap(held_);
    }
    for (auto& [ops, done] : held) {
      inner_->Submit(std::move(ops), std::move(done));
    }
  }

 private:
  std::unique_ptr<BlockIo> inner_;
  Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<std::vector<BlockIoOp>, BlockIoDone>> held_
      ABSL_GUARDED_BY(mu_);
};

// Caches `tokens` on device with a backup, which commits (its pages go to
// the storage tier), as a scheduler's request does.
void StorePrefix(HiCacheEngine& e, const std::vector<int32_t>& tokens) {
  auto load = e.LoadBack("ns", tokens);
  ASSERT_TRUE(load.ok()) << load.status();
  const int64_t n = static_cast<int64_t>(tokens.size());
  constexpr uint64_t kHolder = 1;  // A session's, as the replay's requests.
  auto pages = e.Allocate(n / kP, kHolder);
  ASSERT_TRUE(pages.ok()) << pages.status();
  auto ops = e.PrepareBackups({BackupSpec{*pages, n}}, kHolder);
  ASSERT_TRUE(ops.ok()) << ops.status();
  ASSERT_NE((*ops)[0], 0u);
  ASSERT_TRUE(e.StoreAllLayers((*ops)[0]).ok());
  auto inserted = e.Insert("ns", tokens, *pages, {}, kHolder);
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  ASSERT_FALSE(inserted->deferred);
  ASSERT_TRUE(e.AttachBackup((*ops)[0], inserted->node).ok());
  e.WaitForTransfers();
  e.storage()->Flush();
}

// The prefetch policies (issue 28, "best_effort, wait_complete, timeout"):
// a new engine on a store holding a prefix, whose reads are held back.
// best_effort: the load returns at once without the storage tier's pages,
// which arrive in the host tier in the background for the next load.
// timeout: the load waits its timeout, then goes on without them (counted).
TEST(StorageTierPrefetchTest, BestEffortAndTimeoutDoNotWaitForReads) {
  for (const PrefetchPolicy policy :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kTimeout}) {
    SCOPED_TRACE(PolicyName(policy));
    testing::TempDir dir;
    const std::string path = dir.Child("l3");
    std::vector<int32_t> tokens(8 * kP);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 500 + i;
    {
      Stores stores = OpenStores(path, 1, false);
      auto engine = MakeEngine(1, stores.per_rank);
      ASSERT_TRUE(engine.ok()) << engine.status();
      ASSERT_NO_FATAL_FAILURE(StorePrefix(**engine, tokens));
      ASSERT_EQ((*engine)->storage()->stats().pages_written, 8);
    }
    const KvGeometry g = *KvGeometry::Preset(kPreset, kP);
    GatedBlockIo* gate = nullptr;
    FilePageStoreOptions o;
    o.directory = path;
    o.name = "rank0";
    o.page_bytes = static_cast<int64_t>(g.BytesPerPage());
    o.capacity_pages = 4096;
    o.wrap_io =
        [&gate](std::unique_ptr<BlockIo> inner) -> std::unique_ptr<BlockIo> {
      auto gated = std::make_unique<GatedBlockIo>(std::move(inner));
      gate = gated.get();
      return gated;
    };
    auto store = FilePageStore::Open(std::move(o));
    ASSERT_TRUE(store.ok()) << store.status();
    EngineOptions eo;
    eo.page_size = kP;
    eo.kv_preset = kPreset;
    eo.device_pages_per_rank = 1 + 48;
    eo.host_pages_per_rank = 1 + 64;
    eo.storage = {store->get()};
    eo.storage_recompute_ns_per_token = 0;
    eo.storage_prefetch = policy;
    eo.storage_prefetch_timeout = absl::Milliseconds(20);
    auto engine = HiCacheEngine::Create(eo);
    ASSERT_TRUE(engine.ok()) << engine.status();
    HiCacheEngine& e = **engine;
    auto first = e.LoadBack("ns", tokens);  // Returns with the reads held.
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->loaded_len, 0);
    EXPECT_EQ(first->storage_len, 0);
    if (policy == PrefetchPolicy::kTimeout) {
      EXPECT_EQ(e.StorageReport().prefetch_waits_timed_out, 1);
    }
    // A second load while the first's reads are held joins them.
    auto second = e.LoadBack("ns", tokens);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(second->loaded_len, 0);
    gate->Release();
    e.WaitForPrefetches();
    EXPECT_EQ(e.StorageReport().prefetches_started, 1);
    auto third = e.LoadBack("ns", tokens);  // Now a host hit.
    ASSERT_TRUE(third.ok());
    EXPECT_EQ(third->loaded_len, static_cast<int64_t>(tokens.size()));
    EXPECT_EQ(e.Stats().storage_promoted_pages, 8);
    // DumpTree and InspectNode mark what the storage tier holds.
    const std::vector<NodeInfo> dump = e.Dump({});
    ASSERT_EQ(dump.size(), 1u);
    EXPECT_EQ(dump[0].storage_pages, 8);
    EXPECT_EQ(e.Inspect(dump[0].id)->storage_pages, 8);
    if (third->op_id != 0) {
      e.WaitForTransfers();
      ASSERT_TRUE(e.FinishLoad(third->op_id).ok());
    }
    EXPECT_TRUE(e.CheckInvariants().ok());
  }
}

TEST(StorageTierConfigTest, RefusesStoresThatDoNotFit) {
  testing::TempDir dir;
  Stores stores = OpenStores(dir.Child("l3"), 2, false);
  // One store for two ranks.
  EXPECT_EQ(MakeEngine(2, {stores.per_rank[0]}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEngine(2, {stores.per_rank[0], nullptr}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Pages of another size.
  FilePageStoreOptions o;
  o.directory = dir.Child("other");
  o.page_bytes = 100;
  o.capacity_pages = 4;
  auto other = FilePageStore::Open(std::move(o));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(MakeEngine(1, {other->get()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hicache
