// RadixTree's durable host-tier reports (host_tier_listener.h) against a
// naive index that applies only the documented rules, under random inserts,
// matches, backups and evictions of both tiers (tinylfu splits learned tails;
// inserts split host nodes); and recovery: RestoreHostNode rebuilds, in a
// fresh tree, exactly the host nodes a crash leaves reachable.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/core/clock.h"
#include "daemon/radix/radix_tree.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/tier_recorder.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::hicache::testing::Seq;

constexpr uint32_t kP = 4;

// What a journal's live set holds, kept by the listener rules alone.
struct Record {
  uint64_t parent = kRootParent;
  std::string ns;
  std::vector<int32_t> key;
  CpHostMeta host;

  bool operator==(const Record&) const = default;
};

class ModelIndex final : public HostTierListener {
 public:
  void OnHostCommitted(HostCommit& c) override {
    EXPECT_NE(c.persist_id, 0u);
    EXPECT_FALSE(live_.contains(c.persist_id)) << c.persist_id;
    if (c.parent_persist_id != kRootParent &&
        c.parent_persist_id != kDetachedParent) {
      EXPECT_TRUE(live_.contains(c.parent_persist_id));
    }
    live_.insert_or_assign(
        c.persist_id,
        Record{c.parent_persist_id, std::string(c.ns),
               c.KeyTokens(), *c.host});
    ++events_;
  }
  void OnHostReparented(uint64_t child, uint64_t parent) override {
    auto it = live_.find(child);
    ASSERT_NE(it, live_.end()) << child;
    EXPECT_EQ(it->second.parent, kDetachedParent) << child;
    EXPECT_TRUE(live_.contains(parent)) << parent;
    it->second.parent = parent;
    ++events_;
  }
  void OnHostDropped(uint64_t id) override {
    EXPECT_EQ(live_.erase(id), 1u) << id;
    for (auto& [other, record] : live_) {
      if (record.parent == id) record.parent = kDetachedParent;
    }
    ++events_;
  }
  void OnHostSplit(uint64_t id, int64_t at, uint64_t head) override {
    auto it = live_.find(id);
    ASSERT_NE(it, live_.end()) << id;
    EXPECT_FALSE(live_.contains(head));
    Record old = it->second;
    auto halves = old.host.Split(at);
    ASSERT_TRUE(halves.ok()) << halves.status();
    live_.insert_or_assign(
        head, Record{old.parent, old.ns,
                     std::vector<int32_t>(old.key.begin(), old.key.begin() + at),
                     halves->first});
    live_.insert_or_assign(
        id, Record{head, old.ns,
                   std::vector<int32_t>(old.key.begin() + at, old.key.end()),
                   halves->second});
    ++splits_;
    ++events_;
  }

  const std::map<uint64_t, Record>& live() const { return live_; }
  int64_t splits() const { return splits_; }
  int64_t events() const { return events_; }

 private:
  std::map<uint64_t, Record> live_;
  int64_t splits_ = 0;
  int64_t events_ = 0;
};

std::map<uint64_t, Record> Snapshot(const RadixTree& tree) {
  std::map<uint64_t, Record> out;
  tree.VisitHostTier([&](const HostCommit& c) {
    out.insert_or_assign(
        c.persist_id,
        Record{c.parent_persist_id, std::string(c.ns),
               c.KeyTokens(), *c.host});
  });
  return out;
}

// The records a crash leaves reachable: a chain of recorded parents up to a
// namespace root, none detached.
std::map<uint64_t, Record> Reachable(const std::map<uint64_t, Record>& live) {
  std::map<uint64_t, Record> out;
  for (const auto& [id, record] : live) {
    uint64_t at = id;
    bool ok = true;
    for (int guard = 0; ok && guard < 100000; ++guard) {
      const uint64_t parent = live.at(at).parent;
      if (parent == kRootParent) break;
      if (parent == kDetachedParent || !live.contains(parent)) ok = false;
      else at = parent;
    }
    if (ok) out.insert_or_assign(id, record);
  }
  return out;
}

class PersistTest : public ::testing::TestWithParam<EvictionPolicy> {
 protected:
  void SetUp() override {
    auto tree = RadixTree::Create(
        {.page_size = kP, .cp_size = 1, .policy = GetParam(), .clock = &clock_});
    ASSERT_TRUE(tree.ok());
    tree_ = *std::move(tree);
    tree_->SetHostTierListener(&index_);
  }

  std::vector<LogicalPage> Pages(int64_t tokens) {
    std::vector<LogicalPage> pages((tokens + kP - 1) / kP);
    for (auto& p : pages) p = next_page_++;
    return pages;
  }
  // Backs up `node` (on device, no host copy, no backup in flight).
  bool Backup(NodeId node) {
    auto info = tree_->Inspect(node);
    if (!info.ok()) return false;
    std::vector<std::vector<int64_t>> host(1);
    for (size_t i = 0; i < info->page_owners.size(); ++i) {
      host[0].push_back(next_host_++);
    }
    auto meta = CpHostMeta::Create(info->len, kP, 1, info->page_owners, host);
    if (!meta.ok() || !tree_->BeginBackup(node, *meta).ok()) return false;
    return tree_->CommitBackup(node).ok();
  }
  void ExpectIndexMatchesTree() {
    ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
    EXPECT_EQ(index_.live(), Snapshot(*tree_));
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  ModelIndex index_;
  std::unique_ptr<RadixTree> tree_;
  LogicalPage next_page_ = 100;
  int64_t next_host_ = 0;
};

TEST_P(PersistTest, CommitReportsKeyParentAndReparentsChildren) {
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  auto b = tree_->Insert("", Seq(0, 16), Pages(16));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(Backup(b->node));  // Its parent (a) has no host copy yet.
  ASSERT_EQ(index_.live().size(), 1u);
  EXPECT_EQ(index_.live().begin()->second.parent, kDetachedParent);
  EXPECT_EQ(index_.live().begin()->second.key, Seq(8, 8));
  ASSERT_TRUE(Backup(a->node));  // Now b hangs from a.
  ExpectIndexMatchesTree();
  for (const auto& [id, record] : index_.live()) {
    if (record.key == Seq(0, 8)) EXPECT_EQ(record.parent, kRootParent);
    if (record.key == Seq(8, 8)) EXPECT_NE(record.parent, kDetachedParent);
  }
}

TEST_P(PersistTest, InsertSplittingAHostNodeReportsTheSplit) {
  auto a = tree_->Insert("", Seq(0, 16), Pages(16));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Backup(a->node));
  // Diverges after 8 tokens: the host node splits at a page boundary.
  std::vector<int32_t> other = Seq(0, 8);
  for (int32_t t : Seq(500, 8)) other.push_back(t);
  ASSERT_TRUE(tree_->Insert("", other, Pages(16)).ok());
  EXPECT_EQ(index_.splits(), 1);
  ExpectIndexMatchesTree();
}

TEST_P(PersistTest, DroppingAHostCopyDetachesItsChildren) {
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  auto b = tree_->Insert("", Seq(0, 16), Pages(16));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(Backup(a->node));
  ASSERT_TRUE(Backup(b->node));
  // b leaves the device; a's host copy is then redundant (a is on device).
  tree_->EvictDevice(std::vector<int64_t>{2});
  ExpectIndexMatchesTree();
  HostEvictResult dropped = tree_->EvictHost(std::vector<int64_t>{2},
                                             /*redundant_first=*/true);
  ExpectIndexMatchesTree();
  if (dropped.nodes_dropped > 0) {
    for (const auto& [id, record] : index_.live()) {
      EXPECT_EQ(record.parent, kDetachedParent);
    }
  }
}

// Random traffic: the index the listener keeps equals the tree's host tier
// after every step, and recovery rebuilds the reachable part exactly.
TEST_P(PersistTest, RandomTrafficKeepsTheIndexExact) {
  std::mt19937 rng(GetParam() == EvictionPolicy::kTinyLfu ? 7 : 11);
  auto random_tokens = [&] {
    // Shared prefixes: a few stems, random extensions, some sub-page tails.
    const int stem = std::uniform_int_distribution<int>(0, 5)(rng);
    const int len = std::uniform_int_distribution<int>(1, 40)(rng);
    std::vector<int32_t> tokens;
    for (int i = 0; i < len; ++i) {
      tokens.push_back(i < 12 ? stem * 1000 + i
                              : std::uniform_int_distribution<int>(0, 3)(rng));
    }
    return tokens;
  };
  const std::vector<std::string> namespaces = {"", "tenant"};
  for (int step = 0; step < 3000; ++step) {
    clock_.Advance(absl::Milliseconds(1));
    const std::string& ns = namespaces[rng() % namespaces.size()];
    switch (rng() % 6) {
      case 0:
      case 1: {
        const std::vector<int32_t> tokens = random_tokens();
        auto result = tree_->Insert(ns, tokens, Pages(tokens.size()));
        ASSERT_TRUE(result.ok()) << result.status();
        if (rng() % 2 == 0) (void)Backup(result->node);
        break;
      }
      case 2:
        ASSERT_TRUE(tree_->MatchPrefix(ns, random_tokens()).ok());
        break;
      case 3: {
        std::vector<NodeInfo> nodes = tree_->Dump({});
        if (nodes.empty()) break;
        const NodeInfo& pick = nodes[rng() % nodes.size()];
        if (pick.tier == NodeTier::kDevice && !pick.pending_backup) {
          (void)Backup(pick.id);
        }
        break;
      }
      case 4:
        tree_->EvictDevice(std::vector<int64_t>{
            std::uniform_int_distribution<int64_t>(1, 8)(rng)});
        break;
      case 5:
        tree_->EvictHost(
            std::vector<int64_t>{
                std::uniform_int_distribution<int64_t>(1, 6)(rng)},
            /*redundant_first=*/rng() % 2 == 0);
        break;
    }
    ASSERT_NO_FATAL_FAILURE(ExpectIndexMatchesTree()) << "step " << step;
  }
  EXPECT_GT(index_.events(), 100);
  if (GetParam() == EvictionPolicy::kTinyLfu) EXPECT_GT(index_.splits(), 0);

  // Recovery into a fresh tree: every reachable record, parents first.
  const std::map<uint64_t, Record> reachable = Reachable(index_.live());
  EXPECT_GT(reachable.size(), 0u);
  auto fresh = RadixTree::Create(
      {.page_size = kP, .cp_size = 1, .policy = GetParam(), .clock = &clock_});
  ASSERT_TRUE(fresh.ok());
  // KV events: the restored host tier is announced as it is rebuilt.
  testing::TierRecorder tiers(kP, 0);
  ASSERT_TRUE((*fresh)->SetTierListener(&tiers, kP, 0).ok());
  std::map<uint64_t, NodeId> restored;
  std::vector<uint64_t> order;
  {
    std::map<uint64_t, std::vector<uint64_t>> children;
    for (const auto& [id, record] : reachable) {
      children[record.parent].push_back(id);
    }
    std::vector<uint64_t> stack = children[kRootParent];
    while (!stack.empty()) {
      const uint64_t id = stack.back();
      stack.pop_back();
      order.push_back(id);
      for (uint64_t child : children[id]) stack.push_back(child);
    }
  }
  ASSERT_EQ(order.size(), reachable.size());
  for (uint64_t id : order) {
    const Record& record = reachable.at(id);
    const NodeId parent =
        record.parent == kRootParent ? kNoNode : restored.at(record.parent);
    auto node = (*fresh)->RestoreHostNode(record.ns, parent, record.key,
                                          record.host, id);
    ASSERT_TRUE(node.ok()) << node.status();
    restored[id] = *node;
  }
  ASSERT_TRUE((*fresh)->CheckInvariants().ok()) << (*fresh)->CheckInvariants();
  EXPECT_EQ(Snapshot(**fresh), reachable);
  EXPECT_TRUE(tiers.errors.empty());
  EXPECT_EQ(tiers.held, testing::AnnouncedByTree(**fresh, kP, 0));
  EXPECT_EQ(tiers.Count(Tier::kDevice), 0);
  // And it serves them: each restored node's full key is a host hit of its
  // whole length.
  for (const auto& [id, record] : reachable) {
    std::vector<int32_t> path;
    std::vector<uint64_t> chain;
    for (uint64_t at = id; at != kRootParent; at = reachable.at(at).parent) {
      chain.push_back(at);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const auto& key = reachable.at(*it).key;
      path.insert(path.end(), key.begin(), key.end());
    }
    auto match = (*fresh)->MatchPrefix(record.ns, path,
                                       {.record_hit = false, .exact_tail = true});
    ASSERT_TRUE(match.ok());
    EXPECT_EQ(match->device_len + match->host_hit_len,
              static_cast<int64_t>(path.size()))
        << "persist id " << id;
  }
  // New commits continue above the restored ids.
  ModelIndex after;
  (*fresh)->SetHostTierListener(&after, reachable.rbegin()->first + 1);
  auto extra = (*fresh)->Insert("", Seq(90000, 8), Pages(8));
  ASSERT_TRUE(extra.ok());
  auto info = (*fresh)->Inspect(extra->node);
  ASSERT_TRUE(info.ok());
  std::vector<std::vector<int64_t>> host = {{next_host_, next_host_ + 1}};
  ASSERT_TRUE((*fresh)
                  ->BeginBackup(extra->node,
                                *CpHostMeta::Create(8, kP, 1, info->page_owners,
                                                    host))
                  .ok());
  ASSERT_TRUE((*fresh)->CommitBackup(extra->node).ok());
  ASSERT_EQ(after.live().size(), 1u);
  EXPECT_GT(after.live().begin()->first, reachable.rbegin()->first);
}

// A listener that HoldsKeys (as the host-tier recorder does): it reads each
// commit's key from its token blocks later, after splits, evictions and new
// inserts that would reuse freed blocks, and finds the tokens committed; the
// blocks are reused only once KeysReadThrough passes the commit.
class HoldingIndex final : public HostTierListener {
 public:
  struct Held {
    uint64_t call = 0;
    std::vector<int32_t> key;  // Copied at commit, to compare with.
    std::vector<TokenStore::BlockId> blocks;
    int64_t len = 0;
  };
  bool HoldsKeys() const override { return true; }
  uint64_t KeysReadThrough() const override { return read_through_; }
  void OnHostCommitted(HostCommit& c) override {
    ++calls_;
    EXPECT_TRUE(c.key_pages.empty());  // It reads the blocks.
    ASSERT_NE(c.tokens, nullptr);
    c.key_read_later = true;
    held_.push_back(Held{calls_, c.KeyTokens(),
                         {c.key_blocks.begin(), c.key_blocks.end()},
                         c.host->logical_len()});
  }
  void OnHostReparented(uint64_t, uint64_t) override { ++calls_; }
  void OnHostDropped(uint64_t) override { ++calls_; }
  void OnHostSplit(uint64_t, int64_t, uint64_t) override { ++calls_; }

  // Reads the oldest `n` held keys (as a worker would), then says it has
  // read through the last of them.
  void Read(const TokenStore& tokens, size_t n) {
    n = std::min(n, held_.size());
    for (size_t i = 0; i < n; ++i) {
      std::vector<absl::Span<const int32_t>> pages;
      ASSERT_TRUE(tokens.Pages(held_[i].blocks, held_[i].len, &pages));
      std::vector<int32_t> now;
      for (absl::Span<const int32_t> page : pages) {
        now.insert(now.end(), page.begin(), page.end());
      }
      EXPECT_EQ(now, held_[i].key) << "a key changed before it was read";
      read_through_ = held_[i].call;
    }
    held_.erase(held_.begin(), held_.begin() + n);
    if (held_.empty()) read_through_ = calls_;
  }
  size_t held() const { return held_.size(); }

 private:
  std::vector<Held> held_;
  uint64_t calls_ = 0;
  uint64_t read_through_ = 0;
};

TEST_P(PersistTest, QuarantinedKeysStayIntactUntilRead) {
  HoldingIndex holding;
  tree_->SetHostTierListener(&holding);
  std::mt19937 rng(5);
  int64_t quarantined = 0;
  const TokenStore* tokens = nullptr;
  for (int step = 0; step < 4000; ++step) {
    clock_.Advance(absl::Milliseconds(1));
    std::vector<int32_t> tokens_in;
    const int stem = static_cast<int>(rng() % 5);
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < len; ++i) {
      tokens_in.push_back(i < 10 ? stem * 1000 + i
                                 : static_cast<int32_t>(rng() % 4));
    }
    switch (rng() % 5) {
      case 0:
      case 1: {
        auto result = tree_->Insert("", tokens_in, Pages(tokens_in.size()));
        ASSERT_TRUE(result.ok()) << result.status();
        (void)Backup(result->node);
        break;
      }
      case 2:
        tree_->EvictDevice(std::vector<int64_t>{1 + rng() % 8});
        break;
      case 3:
        tree_->EvictHost(std::vector<int64_t>{1 + rng() % 6},
                         /*redundant_first=*/rng() % 2 == 0);
        break;
      case 4:
        // The reader catches up with part of its backlog now and then.
        if (rng() % 4 == 0) {
          tree_->VisitHostTier(
              [&](const HostCommit& c) { tokens = c.tokens; });
          if (tokens != nullptr) holding.Read(*tokens, rng() % 40);
        }
        break;
    }
    quarantined = std::max(quarantined, tree_->key_blocks_quarantined());
    ASSERT_TRUE(tree_->CheckInvariants().ok()) << "step " << step;
  }
  EXPECT_GT(quarantined, 0);  // Nodes went while their keys were unread.
  tree_->VisitHostTier([&](const HostCommit& c) { tokens = c.tokens; });
  ASSERT_NE(tokens, nullptr);
  holding.Read(*tokens, holding.held());
  tree_->SetHostTierListener(nullptr);
  tree_->ReleaseKeyHolds(holding);
  EXPECT_EQ(tree_->key_blocks_quarantined(), 0);
}

// A detached key reader may still be reading (the engine flushes it after
// detaching): the blocks of a node that goes meanwhile stay in quarantine,
// whatever is inserted, until ReleaseKeyHolds; and no listener may be set
// before that, as the report count the reader is measured against would
// restart.
TEST_P(PersistTest, ADetachedKeyReaderKeepsItsBlocksUntilReleased) {
  HoldingIndex holding;
  tree_->SetHostTierListener(&holding);
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Backup(a->node));
  tree_->SetHostTierListener(nullptr);
  tree_->EvictDevice(std::vector<int64_t>{2});
  tree_->EvictHost(std::vector<int64_t>{2}, /*redundant_first=*/false);
  ASSERT_FALSE(tree_->Inspect(a->node).ok());
  EXPECT_EQ(tree_->key_blocks_quarantined(), 2);
  for (int i = 1; i <= 4; ++i) {
    ASSERT_TRUE(tree_->Insert("", Seq(1000 * i, 8), Pages(8)).ok());
  }
  EXPECT_EQ(tree_->key_blocks_quarantined(), 2);
  EXPECT_DEATH(tree_->SetHostTierListener(&index_),
               "before the last key reader was released");
  tree_->ReleaseKeyHolds(holding);
  EXPECT_EQ(tree_->key_blocks_quarantined(), 0);
  tree_->SetHostTierListener(&index_);  // Now it may.
  ASSERT_TRUE(tree_->CheckInvariants().ok());
}

TEST_P(PersistTest, RestoreRefusesWhatCannotBe) {
  auto host = [](int64_t len, std::vector<int64_t> pages) {
    std::vector<Rank> owners((len + kP - 1) / kP, 0);
    return *CpHostMeta::Create(len, kP, 1, owners, {std::move(pages)});
  };
  auto a = tree_->RestoreHostNode("", kNoNode, Seq(0, 8), host(8, {0, 1}), 5);
  ASSERT_TRUE(a.ok()) << a.status();
  // Repeated id, id 0, length mismatch, empty key.
  EXPECT_FALSE(
      tree_->RestoreHostNode("", kNoNode, Seq(10, 8), host(8, {2, 3}), 5).ok());
  EXPECT_FALSE(
      tree_->RestoreHostNode("", kNoNode, Seq(10, 8), host(8, {2, 3}), 0).ok());
  EXPECT_FALSE(
      tree_->RestoreHostNode("", kNoNode, Seq(10, 4), host(8, {2, 3}), 6).ok());
  EXPECT_FALSE(tree_->RestoreHostNode("", kNoNode, {}, host(8, {2, 3}), 6).ok());
  // Unknown parent, parent in another namespace, parent ending inside a page.
  EXPECT_FALSE(
      tree_->RestoreHostNode("", 999999, Seq(10, 8), host(8, {2, 3}), 6).ok());
  EXPECT_FALSE(
      tree_->RestoreHostNode("other", *a, Seq(10, 8), host(8, {2, 3}), 6).ok());
  auto tail = tree_->RestoreHostNode("", *a, Seq(8, 2), host(2, {4}), 7);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_FALSE(
      tree_->RestoreHostNode("", *tail, Seq(10, 8), host(8, {2, 3}), 8).ok());
  ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  // Restores report nothing.
  EXPECT_EQ(index_.events(), 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, PersistTest,
                         ::testing::Values(EvictionPolicy::kLru,
                                           EvictionPolicy::kTinyLfu),
                         [](const auto& info) {
                           return info.param == EvictionPolicy::kLru
                                      ? std::string("lru")
                                      : std::string("tinylfu");
                         });

}  // namespace
}  // namespace hicache
