// The lanes of a dead CP member, randomized: a workload of inserts,
// backups, loads and locks, then DropLanes; invariants hold and nothing
// matchable touches a dead lane (lane_failure_fixture.h).
#include "tests/engine/lane_failure_fixture.h"

#include <algorithm>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace hicache {
namespace lane_test {
namespace {

TEST_F(LaneFailureTest, RandomWorkloadThenDrop) {
  LaneDropCounts total;  // Over every seed: the cases the model reached.
  for (uint32_t seed = 1; seed <= 24; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    ASSERT_NO_FATAL_FAILURE(Make(4, {0, 1}, /*device_pages=*/24,
                                 /*host_pages=*/40));
    std::vector<std::vector<int32_t>> keys;
    std::vector<NodeId> locks;
    std::vector<uint64_t> loads;
    for (int i = 0; i < 40; ++i) {
      const int kind = rng() % 5;
      if (kind <= 1 || keys.empty()) {
        // Insert: a fresh key or an extension of an old one.
        std::vector<int32_t> key;
        if (!keys.empty() && rng() % 2 == 0) {
          key = keys[rng() % keys.size()];
          key.resize((key.size() / kP) * kP);
        }
        const int extra = 1 + rng() % 12;
        for (int t = 0; t < extra; ++t) {
          key.push_back(static_cast<int32_t>(10000 * seed + 100 * i + t));
        }
        const int64_t n = (static_cast<int64_t>(key.size()) + kP - 1) / kP;
        std::vector<Rank> owners(n);
        for (Rank& o : owners) o = rng() % 4;
        auto pages = engine_->AllocateWithOwners(owners);
        if (!pages.ok()) continue;
        std::vector<uint64_t> ops;
        if (rng() % 2 == 0) {
          auto prepared = engine_->PrepareBackups(
              {BackupSpec{*pages, static_cast<int64_t>(key.size())}});
          ASSERT_TRUE(prepared.ok());
          ops = *prepared;
          for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
            ASSERT_TRUE(engine_->LayerStored(ops, s).ok());
          }
        }
        auto inserted = engine_->Insert("", key, *pages);
        ASSERT_TRUE(inserted.ok()) << inserted.status();
        if (inserted->deferred) {  // A backup in flight (held) is in the way.
          if (!ops.empty() && ops[0] != 0) {
            ASSERT_TRUE(engine_->RollbackBackup(ops[0]).ok());
          }
          ASSERT_TRUE(engine_->Free(*pages).ok());
          continue;
        }
        if (!ops.empty() && ops[0] != 0) {
          const bool attached = inserted->uncached_pages.empty() &&
                                inserted->duplicate_pages.empty() &&
                                engine_->AttachBackup(ops[0], inserted->node)
                                    .ok();
          if (!attached) ASSERT_TRUE(engine_->RollbackBackup(ops[0]).ok());
        }
        if (!inserted->uncached_pages.empty()) {
          ASSERT_TRUE(engine_->Free(inserted->uncached_pages).ok());
        }
        keys.push_back(key);
      } else if (kind == 2) {
        auto hit = engine_->Match("", keys[rng() % keys.size()], false, true);
        ASSERT_TRUE(hit.ok());
        if (hit->device_len > 0) locks.push_back(hit->last_device_node);
      } else if (kind == 3) {
        std::vector<int64_t> evict(4, 0);
        evict[rng() % 4] = 1 + rng() % 4;
        ASSERT_TRUE(engine_->EvictPages(evict, {}).ok());
      } else {
        if (rng() % 2 == 0) {
          split_->Hold();
        }
        auto load = engine_->LoadBack("", keys[rng() % keys.size()]);
        ASSERT_TRUE(load.ok());
        if (load->op_id != 0) {
          loads.push_back(load->op_id);
        } else {
          locks.push_back(load->node);
        }
        if (rng() % 2 == 0) {
          split_->Release();
          engine_->WaitForTransfers();
        }
      }
      ASSERT_TRUE(engine_->CheckInvariants().ok())
          << engine_->CheckInvariants();
    }
    // Loads in flight when the lanes die.
    split_->Hold();
    ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
    for (int i = 0; i < 3; ++i) {
      auto load = engine_->LoadBack("", keys[rng() % keys.size()]);
      ASSERT_TRUE(load.ok());
      if (load->op_id != 0) {
        loads.push_back(load->op_id);
      } else {
        locks.push_back(load->node);
      }
    }
    // Some lanes die (1 or 2 of them), with copies in flight.
    std::set<Rank> dead = {static_cast<Rank>(rng() % 4)};
    if (rng() % 3 == 0) dead.insert(static_cast<Rank>(rng() % 4));
    const std::vector<Rank> lanes(dead.begin(), dead.end());
    ASSERT_TRUE(engine_->SetLanesUnavailable(lanes).ok());
    auto counts = engine_->DropLanes(lanes);
    ASSERT_TRUE(counts.ok());
    total.nodes_removed += counts->nodes_removed;
    total.nodes_detached += counts->nodes_detached;
    total.backups_failed += counts->backups_failed;
    total.loads_failed += counts->loads_failed;
    total.host_pages_freed += counts->host_pages_freed;
    ASSERT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
    ExpectNothingOn(dead);
    for (const auto& key : keys) {
      auto match = engine_->Match("", key, /*peek=*/true);
      ASSERT_TRUE(match.ok());
      for (LogicalPage p : match->device_pages) {
        EXPECT_FALSE(dead.contains(engine_->layout().LaneOf(p)));
      }
    }
    split_->Release();
    engine_->WaitForTransfers();
    for (uint64_t op : loads) ASSERT_TRUE(engine_->FinishLoad(op).ok());
    for (NodeId node : locks) {
      const absl::Status s = engine_->Unlock(node);
      // A lock taken on a node that was later split, merged into a load or
      // dropped is still released by its id.
      EXPECT_TRUE(s.ok()) << s;
    }
    ASSERT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
    EXPECT_EQ(static_cast<int64_t>(engine_->Dump({}).size()),
              engine_->TreeStatistics().nodes);
    ExpectNothingOn(dead);
    // Readmitted: every surviving host copy can load again.
    ASSERT_TRUE(engine_->SetLanesAvailable(lanes).ok());
    for (const auto& key : keys) {
      auto load = engine_->LoadBack("", key);
      ASSERT_TRUE(load.ok());
      engine_->WaitForTransfers();
      if (load->op_id != 0) {
        ASSERT_TRUE(*engine_->LoadDone(load->op_id));
        ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
      } else {
        ASSERT_TRUE(engine_->Unlock(load->node).ok());
      }
    }
    ASSERT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
    engine_.reset();
    split_ = nullptr;
  }
  EXPECT_GT(total.nodes_removed, 0);
  EXPECT_GT(total.nodes_detached, 0);
  EXPECT_GT(total.host_pages_freed, 0);
  EXPECT_GT(total.backups_failed + total.loads_failed, 0);
  std::printf("model: %lld removed, %lld detached, %lld backups and %lld "
              "loads failed, %lld host pages freed\n",
              static_cast<long long>(total.nodes_removed),
              static_cast<long long>(total.nodes_detached),
              static_cast<long long>(total.backups_failed),
              static_cast<long long>(total.loads_failed),
              static_cast<long long>(total.host_pages_freed));
}

}  // namespace
}  // namespace lane_test
}  // namespace hicache
