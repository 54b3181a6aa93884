#pragma once

// The fixture of the lane-failure tests (lane_failure_test.cc,
// lane_failure_model_test.cc): an engine serving every rank of a small CP
// group with pools for some only; the others' copies "run elsewhere"
// through SplitTransferEngine, which can hold their completions.

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/engine/hicache_engine.h"
#include "daemon/transfer/transfer_engine.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"
#include "tests/engine/split_transfer_engine.h"

namespace hicache {
namespace lane_test {

using testing::SplitTransferEngine;
using testing::VerifyKv;
using testing::WriteKv;

constexpr uint32_t kP = 4;

inline std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class LaneFailureTest : public ::testing::Test {
 protected:
  void Make(uint32_t cp_size, std::vector<Rank> local,
            int64_t device_pages = 32, int64_t host_pages = 64,
            WritePolicy policy = WritePolicy::kWriteThroughSelective) {
    local_ = local;
    EngineOptions options{.page_size = kP,
                          .cp_size = cp_size,
                          .kv_preset = "tiny",
                          .device_pages_per_rank = device_pages,
                          .host_pages_per_rank = host_pages,
                          .write_policy = policy};
    options.pool_ranks = local;
    options.wrap_transfer = [this, local](TransferListener* listener,
                                          const TransferEngineFactory& backend) {
      auto split =
          std::make_unique<SplitTransferEngine>(listener, backend, local);
      split_ = split.get();
      return split;
    };
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
  }
  void TearDown() override {
    if (split_ != nullptr) split_->Release();
  }

  bool Local(LogicalPage page) const {
    const Rank lane = engine_->layout().LaneOf(page);
    return std::find(local_.begin(), local_.end(), lane) != local_.end();
  }
  // Writes the KV pattern into the pages of local lanes only (the others'
  // pools live in another daemon).
  void WriteLocal(const std::vector<int32_t>& tokens,
                  const std::vector<LogicalPage>& pages) {
    for (size_t i = 0; i < pages.size(); ++i) {
      if (!Local(pages[i])) continue;
      const size_t end = std::min(tokens.size(), (i + 1) * kP);
      WriteKv(*engine_, absl::MakeConstSpan(tokens).subspan(0, end), pages,
              i * kP);
    }
  }
  // Every byte of a local page (all families and layers).
  std::string PageBytes(LogicalPage page) const {
    const KvGeometry& g = engine_->geometry();
    const Rank rank = engine_->layout().LaneOf(page);
    const KvPool* pool = engine_->pools().device(rank);
    const char* base = static_cast<const char*>(
        pool->host_data() != nullptr ? pool->host_data()
                                     : pool->backend_data());
    std::string out;
    for (int f = 0; f < static_cast<int>(g.families().size()); ++f) {
      for (uint32_t l = 0; l < g.families()[f].num_layers; ++l) {
        out.append(base + g.DeviceOffset(
                              engine_->options().device_pages_per_rank,
                              engine_->layout().PhysicalPageOf(page), f, l),
                   kP * g.families()[f].bytes_per_token);
      }
    }
    return out;
  }

  struct Cached {
    NodeId node = kNoNode;
    std::vector<LogicalPage> pages;
  };
  // Caches `tokens` on pages of `owners` under `ns`; with `backup`, a
  // committed host copy too.
  Cached Cache(const std::string& ns, const std::vector<int32_t>& tokens,
               const std::vector<Rank>& owners, bool backup = true) {
    Cached out;
    auto pages = engine_->AllocateWithOwners(owners);
    EXPECT_TRUE(pages.ok()) << pages.status();
    if (!pages.ok()) return out;
    out.pages = *pages;
    WriteLocal(tokens, *pages);
    std::vector<uint64_t> ops;
    if (backup) {
      auto prepared = engine_->PrepareBackups(
          {BackupSpec{*pages, static_cast<int64_t>(tokens.size())}});
      EXPECT_TRUE(prepared.ok()) << prepared.status();
      ops = *prepared;
      for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
        EXPECT_TRUE(engine_->LayerStored(ops, s).ok());
      }
    }
    auto inserted = engine_->Insert(ns, tokens, *pages);
    EXPECT_TRUE(inserted.ok()) << inserted.status();
    if (!inserted.ok()) return out;
    EXPECT_TRUE(inserted->uncached_pages.empty());
    out.node = inserted->node;
    if (backup) {
      EXPECT_TRUE(engine_->AttachBackup(ops[0], out.node).ok());
    }
    engine_->WaitForTransfers();
    return out;
  }
  // Every unlocked device node to the host tier (or gone, if unbacked).
  void EvictAllDevice() {
    const int64_t per_lane = engine_->options().device_pages_per_rank;
    std::vector<int64_t> all(engine_->layout().cp_size(), per_lane);
    ASSERT_TRUE(engine_->EvictPages(all, {}).ok());
  }
  void ExpectInvariants() {
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }
  // No node the tree reports (and so none a match can reach) has a page
  // or a recorded owner on a lane of `dead`.
  void ExpectNothingOn(const std::set<Rank>& dead) {
    for (const NodeInfo& n : engine_->Dump({})) {
      for (Rank owner : n.page_owners) {
        EXPECT_FALSE(dead.contains(owner))
            << "node " << n.id << " has a page owned by dead lane " << owner;
      }
      auto detail = engine_->Inspect(n.id);
      ASSERT_TRUE(detail.ok());
      for (LogicalPage p : detail->device_pages) {
        EXPECT_FALSE(dead.contains(engine_->layout().LaneOf(p)));
      }
      for (Rank r : dead) {
        if (r < detail->host_pages.size()) {
          EXPECT_TRUE(detail->host_pages[r].empty());
        }
      }
    }
  }

  std::vector<Rank> local_;
  std::unique_ptr<HiCacheEngine> engine_;
  SplitTransferEngine* split_ = nullptr;
};

}  // namespace lane_test
}  // namespace hicache
