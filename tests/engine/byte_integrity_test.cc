// Byte-integrity stress test: thousands of random requests, backups,
// evictions and load-backs through small pools under heavy pressure, for
// C = 1, 2, 4, 8. Every (rank, page, layer, family) row carries a pattern
// derived from the token prefix it holds; every hit's bytes must match it.
// Misses are allowed; wrong bytes and leaked pages are not.
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/engine/hicache_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"

namespace hicache {
namespace {

using testing::VerifyKv;
using testing::WriteKv;

constexpr uint32_t kP = 4;

class Driver {
 public:
  Driver(HiCacheEngine* engine, uint64_t seed, std::string ns)
      : engine_(engine), rng_(seed), ns_(std::move(ns)) {
    for (int i = 0; i < 10; ++i) {
      std::vector<int32_t> base(4 + rng_() % 44);
      for (auto& t : base) t = rng_() % 4;
      bases_.push_back(base);
    }
  }

  // One request: load-back, compute the rest, back it up per layer,
  // insert, attach. Returns false (with a failure recorded) on wrong bytes.
  void Request() {
    const auto& base = bases_[rng_() % bases_.size()];
    std::vector<int32_t> tokens(base.begin(),
                                base.begin() + 1 + rng_() % base.size());
    for (int i = rng_() % 6; i > 0; --i) tokens.push_back(rng_() % 4);
    const int64_t n = tokens.size();

    absl::StatusOr<LoadResult> load = engine_->LoadBack(ns_, tokens);
    ASSERT_TRUE(load.ok()) << load.status();
    int64_t hit = load->device_len + load->loaded_len;
    if (load->op_id != 0) {
      absl::StatusOr<bool> done;
      while ((done = engine_->LoadDone(load->op_id)).ok() && !*done) {
        absl::SleepFor(absl::Microseconds(20));
      }
      if (done.ok()) {
        ++loads_;
      } else {
        ASSERT_EQ(done.status().code(), absl::StatusCode::kAborted);
        hit = load->device_len;  // A failed load is a miss.
      }
    }
    if (hit > 0) {
      absl::Status bytes = VerifyKv(*engine_, tokens, load->pages, hit);
      ASSERT_TRUE(bytes.ok()) << bytes << " (hit " << hit << " of " << n << ")";
      hits_ += hit;
    }
    auto release = [&] {
      if (load->op_id != 0) {
        ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
      } else {
        ASSERT_TRUE(engine_->Unlock(load->node).ok());
      }
    };
    const int64_t reuse = hit / kP;  // Whole pages reused from the hit.
    const int64_t need = (n + kP - 1) / kP - reuse;
    std::vector<LogicalPage> pages(load->pages.begin(),
                                   load->pages.begin() + reuse);
    if (need > 0) {
      absl::StatusOr<std::vector<LogicalPage>> fresh =
          rng_() % 2
              ? engine_->Allocate(need)
              : engine_->AllocateWithOwners(engine_->layout().ComputeOwners(
                    need, ComputeOwnerMode::kZigzag));
      if (!fresh.ok()) {
        ASSERT_EQ(fresh.status().code(), absl::StatusCode::kResourceExhausted);
        release();
        return;
      }
      pages.insert(pages.end(), fresh->begin(), fresh->end());
      WriteKv(*engine_, tokens, pages, reuse * kP);
    }
    std::vector<LogicalPage> fresh_pages(pages.begin() + reuse, pages.end());
    uint64_t op = 0;
    if (need > 0 && rng_() % 4 != 0) {
      auto ops =
          engine_->PrepareBackups({BackupSpec{fresh_pages, n - reuse * kP}});
      ASSERT_TRUE(ops.ok()) << ops.status();
      op = (*ops)[0];
      if (op != 0) {
        if (rng_() % 3 == 0) {
          ASSERT_TRUE(engine_->StoreAllLayers(op).ok());
        } else {
          for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
            const uint64_t one[] = {op};
            ASSERT_TRUE(engine_->LayerStored(one, s).ok());
          }
        }
      }
    }
    if (rng_() % 20 == 0) {  // The request is aborted.
      if (op != 0) {
        ASSERT_TRUE(engine_->RollbackBackup(op).ok());
      }
      ASSERT_TRUE(engine_->Free(fresh_pages).ok());
      release();
      return;
    }
    absl::StatusOr<InsertResult> inserted =
        engine_->Insert(ns_, tokens, pages, {.unfinished = rng_() % 8 == 0});
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    bool attached = false;
    if (op != 0 && !inserted->deferred) {
      attached = engine_->AttachBackup(op, inserted->node).ok();
    }
    if (op != 0 && !attached) {
      ASSERT_TRUE(engine_->RollbackBackup(op).ok());
    }
    if (inserted->deferred) {
      ASSERT_TRUE(engine_->Free(fresh_pages).ok());
    } else if (!inserted->uncached_pages.empty()) {
      ASSERT_TRUE(engine_->Free(inserted->uncached_pages).ok());
    }
    release();
  }

  int64_t hits() const { return hits_; }
  int64_t loads() const { return loads_; }

 private:
  HiCacheEngine* engine_;
  std::mt19937_64 rng_;
  std::string ns_;
  std::vector<std::vector<int32_t>> bases_;
  int64_t hits_ = 0;
  int64_t loads_ = 0;
};

std::unique_ptr<HiCacheEngine> MakeEngine(uint32_t cp, EvictionPolicy policy,
                                          WritePolicy write) {
  auto engine = HiCacheEngine::Create(
      {.page_size = kP,
       .cp_size = cp,
       .kv_preset = "tiny-draft",
       .device_pages_per_rank = 1 + 48 / cp,
       .host_pages_per_rank = 1 + 96 / cp,
       .host_layout = cp % 2 ? HostLayout::kLayerFirst : HostLayout::kPageFirst,
       .write_policy = write,
       .write_through_threshold = 2,
       .eviction_policy = policy,
       .l1_free_room_pages = 1,
       .l2_free_room_pages = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  return *std::move(engine);
}

class ByteIntegrityTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ByteIntegrityTest, EveryHitHasTheBytesThatWereWritten) {
  const uint32_t cp = GetParam();
  auto engine = MakeEngine(cp, static_cast<EvictionPolicy>(cp % 5),
                           static_cast<WritePolicy>(cp % 3));
  Driver driver(engine.get(), 1000 + cp, "");
  for (int step = 0; step < 3000; ++step) {
    ASSERT_NO_FATAL_FAILURE(driver.Request()) << "step " << step;
    if (step % 50 == 0) {
      ASSERT_TRUE(engine->EnforceFreeRoom().ok());
    }
    const absl::Status invariants = engine->CheckInvariants();
    ASSERT_TRUE(invariants.ok()) << "step " << step << ": " << invariants;
  }
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->CheckInvariants().ok());
  // No request holds pages now: every allocated page is the tree's.
  EXPECT_EQ(engine->DeviceAllocatedPages(), engine->TreeDevicePages());
  EXPECT_GT(driver.hits(), 0);
  EXPECT_GT(driver.loads(), 0) << "pressure never forced a load-back";
  const EngineStats stats = engine->Stats();
  RecordProperty("loads", static_cast<int>(stats.loads_done));
  RecordProperty("backups", static_cast<int>(stats.backups_committed));
}

INSTANTIATE_TEST_SUITE_P(CpSizes, ByteIntegrityTest,
                         ::testing::Values(1u, 2u, 4u, 8u));

// Several scheduler threads drive one engine while transfers complete on
// worker threads (run under --config=tsan too).
TEST(ByteIntegrityConcurrencyTest, ManyThreadsOneEngine) {
  auto engine =
      MakeEngine(2, EvictionPolicy::kLru, WritePolicy::kWriteThroughSelective);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Two threads share a namespace, two have their own.
      Driver driver(engine.get(), 77 + t,
                    t < 2 ? "shared" : "own" + std::to_string(t));
      for (int i = 0; i < 400; ++i) {
        driver.Request();
        if (::testing::Test::HasFatalFailure()) {
          ++failures;
          return;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
  EXPECT_EQ(engine->DeviceAllocatedPages(), engine->TreeDevicePages());
}

}  // namespace
}  // namespace hicache
