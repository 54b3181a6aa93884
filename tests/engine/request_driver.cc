#include "tests/engine/request_driver.h"

#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"

namespace hicache::testing {

RequestDriver::RequestDriver(HiCacheEngine* engine, uint64_t seed,
                             std::string ns)
    : engine_(engine), rng_(seed), ns_(std::move(ns)) {
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> base(4 + rng_() % 44);
    for (auto& t : base) t = rng_() % 4;
    bases_.push_back(base);
  }
}

void RequestDriver::Request() {
  constexpr int64_t kP = kPageSize;
  ++counts_.requests;
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
      ++counts_.loads;
    } else {
      ASSERT_EQ(done.status().code(), absl::StatusCode::kAborted)
          << done.status();
      ++counts_.failed_loads;
      hit = load->device_len;  // A failed load is a miss.
    }
  }
  if (hit > 0) {
    absl::Status bytes = VerifyKv(*engine_, tokens, load->pages, hit);
    ASSERT_TRUE(bytes.ok()) << bytes << " (hit " << hit << " of " << n << ")";
    ++counts_.verified;
    counts_.hit_tokens += hit;
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
        rng_() % 2 ? engine_->Allocate(need)
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
      ++counts_.backups;
      if (rng_() % 3 == 0) {
        ASSERT_TRUE(engine_->StoreAllLayers(op).ok());
      } else {
        for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
          const uint64_t one[] = {op};
          const absl::Status stored = engine_->LayerStored(one, s);
          ASSERT_TRUE(stored.ok()) << stored;
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
    if (!attached) ++counts_.attach_refused;
  }
  if (op != 0 && !attached) {
    const absl::Status rolled_back = engine_->RollbackBackup(op);
    ASSERT_TRUE(rolled_back.ok()) << rolled_back;
  }
  if (inserted->deferred) {
    ASSERT_TRUE(engine_->Free(fresh_pages).ok());
  } else if (!inserted->uncached_pages.empty()) {
    ASSERT_TRUE(engine_->Free(inserted->uncached_pages).ok());
  }
  release();
}

ConcurrentDrive DriveConcurrently(HiCacheEngine* engine, uint64_t first_seed,
                                  int requests, int threads) {
  std::atomic<int> failed{0};
  std::vector<RequestDriver::Counts> counts(threads);
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      RequestDriver driver(engine, first_seed + t,
                           t < 2 ? "shared" : "own" + std::to_string(t));
      for (int i = 0; i < requests; ++i) {
        driver.Request();
        if (::testing::Test::HasFatalFailure()) {
          ++failed;
          break;
        }
      }
      counts[t] = driver.counts();
    });
  }
  for (std::thread& thread : running) thread.join();
  ConcurrentDrive out;
  out.failed_threads = failed.load();
  for (const RequestDriver::Counts& c : counts) {
    out.total.requests += c.requests;
    out.total.verified += c.verified;
    out.total.hit_tokens += c.hit_tokens;
    out.total.loads += c.loads;
    out.total.failed_loads += c.failed_loads;
    out.total.backups += c.backups;
    out.total.attach_refused += c.attach_refused;
  }
  return out;
}

}  // namespace hicache::testing
