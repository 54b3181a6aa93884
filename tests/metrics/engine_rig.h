#pragma once

// A small real engine (CP = 2, P = 4, CPU backend) with a session manager,
// and the two requests the metrics tests need: a cached, backed-up prefix
// and its load-back after a device eviction.

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/engine/engine_observer.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "gtest/gtest.h"

namespace hicache::testing {

inline std::vector<int32_t> Tokens(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class EngineRig {
 public:
  static constexpr uint32_t kP = 4;

  // With a state_dir (and a fixed shm_prefix) the engine persists its host
  // tier: a second rig of the same two recovers it.
  explicit EngineRig(EngineObserver* observer = nullptr,
                     std::string state_dir = "", std::string shm_prefix = "") {
    EngineOptions options;
    options.page_size = kP;
    options.cp_size = 2;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = 16;
    options.host_pages_per_rank = 32;
    options.write_policy = WritePolicy::kWriteBack;
    options.observer = observer;
    options.state_dir = std::move(state_dir);
    options.shm_prefix = std::move(shm_prefix);
    auto engine = HiCacheEngine::Create(options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1));
  }

  HiCacheEngine& engine() { return *engine_; }
  SessionManager& sessions() { return *sessions_; }

  // Allocates, backs up every layer, inserts into `ns` and waits for the
  // commit.
  void Cache(const std::string& ns, const std::vector<int32_t>& tokens) {
    const int64_t pages_needed = (tokens.size() + kP - 1) / kP;
    auto pages = engine_->Allocate(pages_needed);
    ASSERT_TRUE(pages.ok()) << pages.status();
    auto ops = engine_->PrepareBackups(
        {BackupSpec{*pages, static_cast<int64_t>(tokens.size())}});
    ASSERT_TRUE(ops.ok()) << ops.status();
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
    }
    auto inserted = engine_->Insert(ns, tokens, *pages);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    ASSERT_TRUE(engine_->AttachBackup((*ops)[0], inserted->node).ok());
    engine_->WaitForTransfers();
  }

  // Evicts every device page, then loads `tokens` of `ns` back.
  void EvictAndLoad(const std::string& ns, const std::vector<int32_t>& tokens) {
    auto evicted = engine_->EvictPages({15, 15}, {});
    ASSERT_TRUE(evicted.ok()) << evicted.status();
    auto load = engine_->LoadBack(ns, tokens);
    ASSERT_TRUE(load.ok()) << load.status();
    ASSERT_NE(load->op_id, 0u);
    engine_->WaitForTransfers();
    ASSERT_TRUE(*engine_->LoadDone(load->op_id));
    ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  }

 private:
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
};

}  // namespace hicache::testing
