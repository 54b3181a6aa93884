// RadixTree::DropLanes / ReapDetached with a durable-index listener (the
// engine's side: tests/engine/lane_failure_test.cc).
#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "daemon/radix/host_tier_listener.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/tier_recorder.h"

namespace hicache {
namespace {

constexpr uint32_t kP = 4;

// The tree's part on its own, with a durable-index listener: every host
// copy DropLanes (and the later reaping) takes away is reported dropped, so
// what the index holds is exactly the tree's host tier, none of it on a dead
// lane.
class IndexListener : public HostTierListener {
 public:
  void OnHostCommitted(HostCommit& commit) override {
    EXPECT_TRUE(live_.emplace(commit.persist_id, commit.host->page_owners())
                    .second);
  }
  void OnHostReparented(uint64_t child, uint64_t parent) override {}
  void OnHostDropped(uint64_t persist_id) override {
    EXPECT_EQ(live_.erase(persist_id), 1u) << persist_id;
  }
  void OnHostSplit(uint64_t persist_id, int64_t at,
                   uint64_t head_persist_id) override {
    auto it = live_.find(persist_id);
    ASSERT_NE(it, live_.end());
    std::vector<Rank> owners = it->second;
    const size_t k = static_cast<size_t>(at / kP);
    live_[head_persist_id] =
        std::vector<Rank>(owners.begin(), owners.begin() + k);
    it->second = std::vector<Rank>(owners.begin() + k, owners.end());
  }
  const std::map<uint64_t, std::vector<Rank>>& live() const { return live_; }

 private:
  std::map<uint64_t, std::vector<Rank>> live_;
};

TEST(RadixLanesTest, TheHostIndexHearsEveryDroppedCopy) {
  constexpr uint32_t kC = 4;
  int64_t removed = 0, detached = 0, host_freed = 0;
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    auto created = RadixTree::Create({.page_size = kP, .cp_size = kC});
    ASSERT_TRUE(created.ok());
    RadixTree& tree = **created;
    IndexListener index;
    tree.SetHostTierListener(&index);
    // KV events too, in blocks of a whole page.
    testing::TierRecorder tiers(kP, seed);
    ASSERT_TRUE(tree.SetTierListener(&tiers, kP, seed).ok());
    auto announced_exactly = [&] {
      EXPECT_TRUE(tiers.errors.empty()) << tiers.errors.front();
      EXPECT_EQ(tiers.held, testing::AnnouncedByTree(tree, kP, seed));
    };
    int64_t next_page = 1;
    std::vector<int64_t> next_host(kC, 0);
    std::vector<std::vector<int32_t>> keys;
    std::vector<NodeId> locks;
    auto tier = [&] {
      std::map<uint64_t, std::vector<Rank>> seen;
      tree.VisitHostTier([&](const HostCommit& c) {
        seen[c.persist_id] = c.host->page_owners();
      });
      return seen;
    };
    for (int i = 0; i < 60; ++i) {
      const int kind = rng() % 4;
      if (kind <= 1 || keys.empty()) {
        std::vector<int32_t> key;
        if (!keys.empty() && rng() % 2 == 0) {
          key = keys[rng() % keys.size()];
          key.resize((key.size() / kP) * kP);
        }
        const int extra = 1 + rng() % 12;
        for (int t = 0; t < extra; ++t) {
          key.push_back(static_cast<int32_t>(100 * i + t));
        }
        std::vector<LogicalPage> pages((key.size() + kP - 1) / kP);
        for (LogicalPage& p : pages) p = (next_page++) * kC + rng() % kC;
        auto inserted = tree.Insert("", key, pages);
        ASSERT_TRUE(inserted.ok());
        keys.push_back(key);
        auto info = tree.Inspect(inserted->node);
        if (rng() % 3 != 0 && info.ok() && info->tier == NodeTier::kDevice &&
            !info->pending_backup && info->len > 0) {
          std::vector<std::vector<int64_t>> host(kC);
          for (Rank owner : info->page_owners) {
            host[owner].push_back(next_host[owner]++);
          }
          auto meta = CpHostMeta::Create(info->len, kP, kC, info->page_owners,
                                         host);
          ASSERT_TRUE(meta.ok());
          ASSERT_TRUE(tree.BeginBackup(inserted->node, *meta).ok());
          ASSERT_TRUE(tree.CommitBackup(inserted->node).ok());
        }
      } else if (kind == 2) {
        auto hit = tree.MatchPrefix("", keys[rng() % keys.size()],
                                    {.split_at_hit = true});
        ASSERT_TRUE(hit.ok());
        if (hit->device_len > 0 && rng() % 2 == 0) {
          ASSERT_TRUE(tree.Lock(hit->last_device_node).ok());
          locks.push_back(hit->last_device_node);
        }
      } else {
        std::vector<int64_t> need(kC, 0);
        need[rng() % kC] = 1 + rng() % 3;
        tree.EvictDevice(need);
      }
      ASSERT_EQ(tier(), index.live());
      announced_exactly();
    }
    const Rank dead_lane = rng() % kC;
    std::vector<bool> dead(kC, false);
    dead[dead_lane] = true;
    tree.SetUnmatchableLanes(dead);
    const LaneDropResult dropped = tree.DropLanes(dead);
    ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants();
    ASSERT_EQ(tier(), index.live());
    announced_exactly();  // Detached nodes are withdrawn at once.
    for (const auto& [id, owners] : index.live()) {
      EXPECT_EQ(std::count(owners.begin(), owners.end(), dead_lane), 0);
    }
    for (const auto& key : keys) {
      auto match = tree.MatchPrefix("", key, {.record_hit = false});
      ASSERT_TRUE(match.ok());
      for (LogicalPage p : match->device_pages) EXPECT_NE(p % kC, dead_lane);
    }
    EXPECT_EQ(tree.DetachedNodes(), dropped.nodes_detached);
    removed += dropped.nodes_removed;
    detached += dropped.nodes_detached;
    for (const auto& rank : dropped.freed_host_pages) host_freed += rank.size();
    for (NodeId node : locks) ASSERT_TRUE(tree.Unlock(node).ok());
    const LaneDropResult reaped = tree.ReapDetached();
    EXPECT_EQ(reaped.nodes_removed, dropped.nodes_detached);
    EXPECT_EQ(tree.DetachedNodes(), 0);
    ASSERT_TRUE(tree.CheckInvariants().ok()) << tree.CheckInvariants();
    ASSERT_EQ(tier(), index.live());
    announced_exactly();
    tree.SetHostTierListener(nullptr);
  }
  EXPECT_GT(removed, 0);
  EXPECT_GT(detached, 0);
  EXPECT_GT(host_freed, 0);
}

}  // namespace
}  // namespace hicache
