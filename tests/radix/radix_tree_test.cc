// Named scenarios for every page rule of the radix tree (P = 4 throughout).
#include "daemon/radix/radix_tree.h"

#include <numeric>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kP = 4;

using ::hicache::testing::Cat;
using ::hicache::testing::Seq;

class RadixTreeTest : public ::testing::Test {
 protected:
  void SetUp() override { Reset(1); }
  void Reset(uint32_t cp_size, EvictionPolicy policy = EvictionPolicy::kLru,
             uint32_t write_through_threshold = 0) {
    auto tree =
        RadixTree::Create({.page_size = kP,
                           .cp_size = cp_size,
                           .policy = policy,
                           .write_through_threshold = write_through_threshold,
                           .clock = &clock_});
    ASSERT_TRUE(tree.ok());
    tree_ = *std::move(tree);
    next_page_ = 100;
  }
  // Fresh pages for n tokens (lanes rotate with the page id).
  std::vector<LogicalPage> Pages(int64_t tokens) {
    std::vector<LogicalPage> pages((tokens + kP - 1) / kP);
    for (auto& p : pages) p = next_page_++;
    return pages;
  }
  InsertResult Insert(const std::vector<int32_t>& tokens,
                      std::vector<LogicalPage> pages,
                      InsertOptions options = {}) {
    auto result = tree_->Insert("", tokens, pages, options);
    EXPECT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
    return result.ok() ? *result : InsertResult{};
  }
  InsertResult Insert(const std::vector<int32_t>& tokens) {
    return Insert(tokens, Pages(tokens.size()));
  }
  MatchResult Match(const std::vector<int32_t>& tokens) {
    auto result = tree_->MatchPrefix("", tokens);
    EXPECT_TRUE(result.ok());
    return *result;
  }
  // Backs up `node` with host pages 0.. of rank 0 and commits it.
  void Backup(NodeId node) {
    auto info = *tree_->Inspect(node);
    std::vector<std::vector<int64_t>> host(tree_->options().cp_size);
    for (Rank owner : info.page_owners) host[owner].push_back(next_host_++);
    ASSERT_TRUE(
        tree_
            ->BeginBackup(node, *CpHostMeta::Create(info.len, kP,
                                                    tree_->options().cp_size,
                                                    info.page_owners, host))
            .ok());
    ASSERT_TRUE(tree_->CommitBackup(node).ok());
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<RadixTree> tree_;
  LogicalPage next_page_ = 100;
  int64_t next_host_ = 0;
};

TEST_F(RadixTreeTest, EmptyTreeMatchesNothing) {
  MatchResult m = Match(Seq(0, 8));
  EXPECT_EQ(m.device_len, 0);
  EXPECT_EQ(m.host_hit_len, 0);
  EXPECT_EQ(m.last_device_node, kNoNode);
}

TEST_F(RadixTreeTest, PageGranularMatch) {
  auto pages = Pages(12);
  Insert(Seq(0, 12), pages);
  // Query diverging at token 6: floors to the page boundary 4.
  MatchResult m = Match(Cat(Seq(0, 6), Seq(900, 6)));
  EXPECT_EQ(m.device_len, 4);
  EXPECT_THAT(m.device_pages, ElementsAre(pages[0]));
  // Whole prefix of full pages.
  m = Match(Seq(0, 8));
  EXPECT_EQ(m.device_len, 8);
  EXPECT_THAT(m.device_pages, ElementsAre(pages[0], pages[1]));
  // A query that ends inside a page of a longer node floors too.
  EXPECT_EQ(Match(Seq(0, 7)).device_len, 4);
}

TEST_F(RadixTreeTest, ExactValidTailHit) {
  auto pages = Pages(10);  // 2 full pages + a 2-token tail page.
  InsertResult r = Insert(Seq(0, 10), pages);
  EXPECT_EQ(r.cached_len, 10);
  MatchResult m = Match(Seq(0, 10));  // Ends exactly at the valid tail.
  EXPECT_EQ(m.device_len, 10);
  EXPECT_THAT(m.device_pages, ElementsAre(pages[0], pages[1], pages[2]));
  EXPECT_EQ(m.last_device_node, r.node);
}

TEST_F(RadixTreeTest, QueryExtendingPastTailFloors) {
  Insert(Seq(0, 10));
  MatchResult m = Match(Seq(0, 14));  // Runs past the partial tail page.
  EXPECT_EQ(m.device_len, 8);
  EXPECT_EQ(m.device_pages.size(), 2u);
}

TEST_F(RadixTreeTest, BackedTailFloorsAndIsNeverSplitInsideItsPage) {
  InsertResult r = Insert(Seq(0, 10));
  Backup(r.node);
  // Evict to host: the tail node becomes host-only.
  DeviceEvictResult e = tree_->EvictDeviceTokens(10);
  EXPECT_EQ(e.nodes_to_host, 1);
  MatchResult m = Match(Seq(0, 10));
  EXPECT_EQ(m.device_len, 0);
  EXPECT_EQ(m.host_hit_len, 10);     // Exact valid tail on host.
  m = Match(Cat(Seq(0, 9), {555}));  // Diverges inside the padded tail page.
  EXPECT_EQ(m.host_hit_len, 8);
  // Inserting a longer key never splits the backed node inside its tail
  // page: it splits at the page boundary and the rest goes beside the
  // backed tail, which keeps serving exact queries from host.
  auto pages = Pages(14);
  InsertResult longer = Insert(Seq(0, 14), pages);
  EXPECT_EQ(longer.cached_len, 14);
  EXPECT_THAT(longer.uncached_pages, IsEmpty());
  EXPECT_THAT(Match(Seq(0, 14)).device_pages,
              ElementsAre(pages[0], pages[1], pages[2], pages[3]));
  m = Match(Seq(0, 10));
  EXPECT_EQ(m.device_len, 8);
  EXPECT_EQ(m.host_hit_len, 2);  // The backed tail, beside the new leaf.
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, DuplicatePagesAreWholePagesTheTreeAlreadyHas) {
  auto first = Pages(12);
  Insert(Seq(0, 12), first);
  auto second = Pages(16);
  InsertResult r = Insert(Cat(Seq(0, 12), Seq(50, 4)), second);
  EXPECT_EQ(r.present_len, 12);
  EXPECT_EQ(r.cached_len, 16);
  EXPECT_THAT(r.duplicate_pages, ElementsAre(second[0], second[1], second[2]));
  EXPECT_THAT(r.uncached_pages, IsEmpty());
  // The tree kept its own pages and adopted only the new one.
  EXPECT_THAT(Match(Cat(Seq(0, 12), Seq(50, 4))).device_pages,
              ElementsAre(first[0], first[1], first[2], second[3]));
}

TEST_F(RadixTreeTest, MatchedPrefixPagesPassedBackAreNotDuplicates) {
  auto first = Pages(8);
  Insert(Seq(0, 8), first);
  // The scheduler reuses the matched pages for the prefix of a longer key.
  auto tail = Pages(4);
  InsertResult r =
      Insert(Cat(Seq(0, 8), Seq(40, 4)), {first[0], first[1], tail[0]});
  EXPECT_EQ(r.present_len, 8);
  EXPECT_THAT(r.duplicate_pages, IsEmpty());
  EXPECT_THAT(Match(Cat(Seq(0, 8), Seq(40, 4))).device_pages,
              ElementsAre(first[0], first[1], tail[0]));
}

TEST_F(RadixTreeTest, DivergenceInsideAPageSplitsAtTheFloor) {
  auto a = Pages(12);
  Insert(Seq(0, 12), a);
  auto b = Pages(12);
  InsertResult r = Insert(Cat(Seq(0, 6), Seq(700, 6)), b);
  EXPECT_EQ(r.present_len, 4);
  EXPECT_THAT(r.duplicate_pages, ElementsAre(b[0]));
  EXPECT_EQ(tree_->Stats().nodes, 3);  // Shared head + two branches.
  EXPECT_THAT(Match(Cat(Seq(0, 6), Seq(700, 6))).device_pages,
              ElementsAre(a[0], b[1], b[2]));
  EXPECT_THAT(Match(Seq(0, 12)).device_pages, ElementsAre(a[0], a[1], a[2]));
}

TEST_F(RadixTreeTest, StaleSubPageTailIsPrunedWhenSafe) {
  auto short_pages = Pages(6);
  Insert(Seq(0, 6), short_pages);
  auto long_pages = Pages(12);
  InsertResult r = Insert(Seq(0, 12), long_pages);
  EXPECT_THAT(r.released_pages, ElementsAre(short_pages[1]));
  EXPECT_THAT(r.duplicate_pages, ElementsAre(long_pages[0]));
  EXPECT_EQ(r.cached_len, 12);
  EXPECT_THAT(Match(Seq(0, 12)).device_pages,
              ElementsAre(short_pages[0], long_pages[1], long_pages[2]));
}

// Issue 12 item 8 (multi-turn chat): a locked sub-page tail is not pruned,
// but the longer key is still cached in full, beside it.
TEST_F(RadixTreeTest, LockedTailStaysAndTheExtensionGoesBesideIt) {
  auto first_pages = Pages(6);
  InsertResult first = Insert(Seq(0, 6), first_pages);
  ASSERT_TRUE(tree_->Lock(first.node).ok());
  auto pages = Pages(12);
  InsertResult r = Insert(Seq(0, 12), pages);
  EXPECT_THAT(r.released_pages, IsEmpty());
  EXPECT_EQ(r.cached_len, 12);
  EXPECT_THAT(r.uncached_pages, IsEmpty());
  EXPECT_THAT(r.duplicate_pages, ElementsAre(pages[0]));
  EXPECT_THAT(Match(Seq(0, 12)).device_pages,
              ElementsAre(first_pages[0], pages[1], pages[2]));
  EXPECT_EQ(Match(Seq(0, 6)).device_len, 6);  // The tail still serves.
  // The new leaf holds exactly the new pages (a backup can attach to it).
  EXPECT_THAT(tree_->Inspect(r.node)->device_pages,
              ElementsAre(pages[1], pages[2]));
  // Unlocked, the old tail is an ordinary evictable leaf.
  ASSERT_TRUE(tree_->Unlock(first.node).ok());
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, MatchCanFloorAnExactTail) {
  Insert(Seq(0, 10));
  EXPECT_EQ(Match(Seq(0, 10)).device_len, 10);
  auto floored = tree_->MatchPrefix("", Seq(0, 10), {.exact_tail = false});
  ASSERT_TRUE(floored.ok());
  EXPECT_EQ(floored->device_len, 8);
  EXPECT_EQ(floored->device_pages.size(), 2u);
}

// With split_at_hit the lock of a floored hit covers only the hit, so the
// request's own longer insert can still replace the stale tail.
TEST_F(RadixTreeTest, SplitAtHitLocksOnlyTheHit) {
  auto first_pages = Pages(10);
  Insert(Seq(0, 10), first_pages);
  auto m = tree_->MatchPrefix("", Seq(0, 14), {.split_at_hit = true});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_len, 8);
  EXPECT_EQ(tree_->Inspect(m->last_device_node)->len, 8);
  ASSERT_TRUE(tree_->Lock(m->last_device_node).ok());
  EXPECT_TRUE(tree_->CheckInvariants().ok());
  auto pages = Pages(14);
  InsertResult r = Insert(Seq(0, 14), {first_pages[0], first_pages[1],
                                       pages[2], pages[3]});
  EXPECT_THAT(r.released_pages, ElementsAre(first_pages[2]));  // Pruned.
  EXPECT_EQ(r.cached_len, 14);
  EXPECT_EQ(tree_->Stats().nodes, 2);
  ASSERT_TRUE(tree_->Unlock(m->last_device_node).ok());
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, HitInsideAPendingNodeIsTailBlocked) {
  InsertResult r = Insert(Seq(0, 12));
  auto info = *tree_->Inspect(r.node);
  ASSERT_TRUE(
      tree_
          ->BeginBackup(r.node, *CpHostMeta::Create(12, kP, 1, info.page_owners,
                                                    {{1, 2, 3}}))
          .ok());
  auto m = tree_->MatchPrefix("", Cat(Seq(0, 8), Seq(900, 4)),
                              {.split_at_hit = true});
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->device_len, 8);
  EXPECT_TRUE(m->tail_blocked);  // Not split: the insert would defer.
  EXPECT_EQ(tree_->Stats().nodes, 1);
  EXPECT_FALSE(Match(Seq(0, 12)).tail_blocked);
}

TEST_F(RadixTreeTest, DeferredInsertChangesNothing) {
  InsertResult r = Insert(Seq(0, 12));
  auto info = *tree_->Inspect(r.node);
  ASSERT_TRUE(
      tree_
          ->BeginBackup(r.node, *CpHostMeta::Create(12, kP, 1, info.page_owners,
                                                    {{1, 2, 3}}))
          .ok());
  // Pending backups are invisible to matches.
  MatchResult before = Match(Seq(0, 12));
  EXPECT_EQ(before.host_hit_len, 0);
  const auto dump_before = tree_->Dump({});
  // Diverging inside the pending node would split it: deferred.
  auto deferred = tree_->Insert("", Cat(Seq(0, 8), Seq(900, 4)), Pages(12));
  ASSERT_TRUE(deferred.ok());
  EXPECT_TRUE(deferred->deferred);
  const auto dump_after = tree_->Dump({});
  ASSERT_EQ(dump_before.size(), dump_after.size());
  EXPECT_EQ(dump_after[0].len, 12);
  EXPECT_TRUE(tree_->CheckInvariants().ok());
  // After the commit the same insert goes through.
  ASSERT_TRUE(tree_->CommitBackup(r.node).ok());
  auto retried = tree_->Insert("", Cat(Seq(0, 8), Seq(900, 4)), Pages(12));
  ASSERT_TRUE(retried.ok());
  EXPECT_FALSE(retried->deferred);
  EXPECT_EQ(retried->present_len, 8);
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, PendingSubPageTailDoesNotDeferAnExtension) {
  // A prunable stale tail [7 7 7] and a pending tail [7 7] share a page: an
  // insert running past both prunes the first and goes beside the second
  // (the dry run that checks for deferral agrees).
  auto stale = Pages(3);
  Insert({7, 7, 7}, stale);
  InsertResult pending = Insert({7, 7});
  ASSERT_TRUE(
      tree_
          ->BeginBackup(pending.node, *CpHostMeta::Create(2, kP, 1, {0}, {{5}}))
          .ok());
  auto r = tree_->Insert("", {7, 7, 7, 1, 2, 3}, Pages(6));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->deferred);
  EXPECT_EQ(r->cached_len, 6);
  EXPECT_THAT(r->released_pages, ElementsAre(stale[0]));
  EXPECT_EQ(Match({7, 7, 7, 1, 2, 3}).device_len, 6);
  EXPECT_EQ(tree_->Stats().nodes, 2);
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

// A node being loaded back (host_ref) is never split: the load attaches
// pages for the whole node, and a split would leave the head holding a copy
// of the load's host reference forever (found by the service fuzzer:
// fuzz/corpus/crashes/load_split_host_ref_leak).
TEST_F(RadixTreeTest, NodeBeingLoadedIsNeverSplit) {
  InsertResult r = Insert(Seq(0, 16));
  Backup(r.node);
  ASSERT_EQ(tree_->EvictDeviceTokens(16).nodes_to_host, 1);
  ASSERT_TRUE(tree_->AddHostRef(r.node).ok());  // A load is reading it.
  // Diverges inside the node, and runs past a tail: neither splits it.
  InsertResult diverging = Insert(Cat(Seq(0, 12), Seq(900, 8)));
  EXPECT_EQ(diverging.cached_len, 0);
  EXPECT_EQ(tree_->Stats().nodes, 1);
  EXPECT_EQ(tree_->Inspect(r.node)->len, 16);
  ASSERT_TRUE(tree_->ReleaseHostRef(r.node).ok());
  EXPECT_EQ(tree_->Inspect(r.node)->host_ref, 0);
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, NodeBeingLoadedWithATailIsNeverSplit) {
  InsertResult r = Insert(Seq(0, 10));
  Backup(r.node);
  ASSERT_EQ(tree_->EvictDeviceTokens(10).nodes_to_host, 1);
  ASSERT_TRUE(tree_->AddHostRef(r.node).ok());
  InsertResult longer = Insert(Seq(0, 14));
  EXPECT_EQ(longer.cached_len, 0);
  EXPECT_EQ(tree_->Stats().nodes, 1);
  ASSERT_TRUE(tree_->ReleaseHostRef(r.node).ok());
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, PendingTailThatNeedsASplitDefers) {
  // The pending node spans a full page before its tail: running past it
  // needs a split at that page, which waits for the backup.
  InsertResult pending = Insert(Seq(0, 6));
  auto info = *tree_->Inspect(pending.node);
  ASSERT_TRUE(
      tree_
          ->BeginBackup(pending.node, *CpHostMeta::Create(6, kP, 1,
                                                          info.page_owners,
                                                          {{5, 6}}))
          .ok());
  auto r = tree_->Insert("", Seq(0, 12), Pages(12));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->deferred);
  EXPECT_EQ(tree_->Stats().nodes, 1);
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, UnfinishedInsertExposesOnlyCompletePages) {
  auto pages = Pages(10);
  InsertResult r = Insert(Seq(0, 10), pages, {.unfinished = true});
  EXPECT_EQ(r.cached_len, 8);
  EXPECT_THAT(r.uncached_pages, ElementsAre(pages[2]));
  EXPECT_EQ(Match(Seq(0, 10)).device_len, 8);
}

TEST_F(RadixTreeTest, NoGhostNodes) {
  Insert(Seq(0, 8));
  const int64_t nodes = tree_->Stats().nodes;
  for (int i = 0; i < 100; ++i) Match(Seq(1000 + i, 8));
  Match(Cat(Seq(0, 4), Seq(5000, 8)));
  EXPECT_EQ(tree_->Stats().nodes, nodes);
  EXPECT_EQ(tree_->Stats().namespaces, 1);
  // Looking up an unknown namespace creates no root either.
  ASSERT_TRUE(tree_->MatchPrefix("tenant-b", Seq(0, 8)).ok());
  EXPECT_EQ(tree_->Stats().namespaces, 1);
}

TEST_F(RadixTreeTest, NamespacesNeverShareNodes) {
  ASSERT_TRUE(tree_->Insert("a", Seq(0, 8), Pages(8)).ok());
  EXPECT_EQ(tree_->MatchPrefix("b", Seq(0, 8))->device_len, 0);
  EXPECT_EQ(tree_->MatchPrefix("a", Seq(0, 8))->device_len, 8);
}

TEST_F(RadixTreeTest, LocksProtectAlongThePath) {
  InsertResult a = Insert(Seq(0, 8));
  InsertResult b = Insert(Cat(Seq(0, 8), Seq(50, 4)));
  ASSERT_TRUE(tree_->Lock(b.node).ok());
  TreeStats s = tree_->Stats();
  EXPECT_EQ(s.device_tokens, 12);
  EXPECT_EQ(s.protected_tokens, 12);
  EXPECT_EQ(s.evictable_tokens, 0);
  EXPECT_EQ(tree_->EvictDeviceTokens(100).evicted_tokens, 0);
  ASSERT_TRUE(tree_->Unlock(b.node).ok());
  EXPECT_EQ(tree_->Unlock(b.node).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tree_->Lock(424242).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tree_->Stats().evictable_tokens, 12);
  (void)a;
}

TEST_F(RadixTreeTest, EvictionRemovesUnbackedAndKeepsBackedOnHost) {
  InsertResult a = Insert(Seq(0, 8));
  clock_.Advance(absl::Seconds(1));
  InsertResult b = Insert(Seq(100, 8));
  Backup(b.node);
  clock_.Advance(absl::Seconds(1));
  Match(Seq(0, 8));  // a is now more recent than b.
  DeviceEvictResult e = tree_->EvictDeviceTokens(8);  // LRU: b goes first.
  EXPECT_EQ(e.nodes_to_host, 1);
  EXPECT_EQ(e.freed_pages[0].size(), 2u);
  EXPECT_EQ(Match(Seq(100, 8)).host_hit_len, 8);
  e = tree_->EvictDeviceTokens(8);
  EXPECT_EQ(e.nodes_removed, 1);
  EXPECT_EQ(Match(Seq(0, 8)).device_len, 0);
  EXPECT_FALSE(tree_->Inspect(a.node).ok());
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, EvictionTargetsShortLanes) {
  Reset(2);
  // Pages 100, 101 -> lanes 0, 1; pages 102.. likewise.
  InsertResult lane0 = Insert(Seq(0, 4), {200});   // lane 0
  InsertResult lane1 = Insert(Seq(50, 4), {301});  // lane 1
  DeviceEvictResult e = tree_->EvictDevice({0, 1});
  EXPECT_THAT(e.freed_pages[1], ElementsAre(301));
  EXPECT_THAT(e.freed_pages[0], IsEmpty());
  EXPECT_TRUE(tree_->Inspect(lane0.node).ok());
  (void)lane1;
}

// Seed 001 (owner-lane capacity): "small lane deficits despite large
// aggregate evictable capacity". The short lane's pages sit only in an
// ancestor, every evictable leaf holds other lanes: eviction takes the
// ancestor's subtree, children first, to reach it. Locked subtrees and
// subtrees with a backup in flight stay; a leaf that leads to no short-lane
// page stays.
TEST_F(RadixTreeTest, EvictionUnlocksAncestorsInShortLanes) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE("C = " + std::to_string(cp));
    Reset(cp);
    const Rank short_lane = cp - 1;
    LogicalPage next = 1000 * cp;
    auto in = [&](Rank lane) {
      const LogicalPage page = next + lane;
      next += cp;
      return page;
    };
    auto need_short = [&](int64_t pages) {
      std::vector<int64_t> need(cp, 0);
      need[short_lane] = pages;
      return need;
    };
    auto on_device = [&](const InsertResult& r) {
      auto info = tree_->Inspect(r.node);
      return info.ok() && info->tier != NodeTier::kHost;
    };
    // Oldest first, so that taking leaves blindly in LRU order would take
    // them: D, a leaf in lane 0 with no short-lane ancestor.
    InsertResult d = Insert(Seq(500, 4), {in(0)});
    clock_.Advance(absl::Seconds(1));
    // Q, in the short lane, with a locked child.
    const LogicalPage q_page = in(short_lane);
    const LogicalPage qc_page = in(0);
    InsertResult q = Insert(Seq(700, 4), {q_page});
    InsertResult qc = Insert(Cat(Seq(700, 4), Seq(710, 4)), {q_page, qc_page});
    ASSERT_TRUE(tree_->Lock(qc.node).ok());
    clock_.Advance(absl::Seconds(1));
    // R, in the short lane, with a child whose backup is in flight.
    const LogicalPage r_page = in(short_lane);
    InsertResult r = Insert(Seq(900, 4), {r_page});
    InsertResult rc = Insert(Cat(Seq(900, 4), Seq(910, 4)), {r_page, in(0)});
    {
      std::vector<std::vector<int64_t>> host(cp);
      host[0].push_back(next_host_++);
      ASSERT_TRUE(
          tree_->BeginBackup(rc.node, *CpHostMeta::Create(4, kP, cp, {0}, host))
              .ok());
    }
    clock_.Advance(absl::Seconds(1));
    // A (short lane) <- B (lane 0) <- {C1 (lane 0), C2 (lane 1 when C > 2)}.
    const LogicalPage a_page = in(short_lane);
    const LogicalPage b_page = in(0);
    const LogicalPage c1_page = in(0);
    const LogicalPage c2_page = in(cp > 2 ? 1 : 0);
    InsertResult a = Insert(Seq(0, 4), {a_page});
    InsertResult b = Insert(Seq(0, 8), {a_page, b_page});
    InsertResult c1 =
        Insert(Cat(Seq(0, 8), Seq(100, 4)), {a_page, b_page, c1_page});
    InsertResult c2 =
        Insert(Cat(Seq(0, 8), Seq(200, 4)), {a_page, b_page, c2_page});
    clock_.Advance(absl::Seconds(1));
    // E, the newest, directly in the short lane.
    const LogicalPage e_page = in(short_lane);
    InsertResult e = Insert(Seq(300, 4), {e_page});
    ASSERT_EQ(tree_->Inspect(b.node)->parent, a.node);

    // 1. A leaf in the short lane is taken before any ancestor is unlocked.
    DeviceEvictResult ev = tree_->EvictDevice(need_short(1));
    EXPECT_THAT(ev.freed_pages[short_lane], ElementsAre(e_page));
    EXPECT_EQ(ev.nodes_removed, 1);
    EXPECT_TRUE(on_device(c1));
    ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();

    // 2. Now only ancestors hold short-lane pages: A is reached through its
    //    children; their pages (other lanes) are the price.
    ev = tree_->EvictDevice(need_short(1));
    EXPECT_THAT(ev.freed_pages[short_lane], ElementsAre(a_page));
    std::vector<LogicalPage> others;
    for (Rank l = 0; l < cp; ++l) {
      if (l == short_lane) continue;
      others.insert(others.end(), ev.freed_pages[l].begin(),
                    ev.freed_pages[l].end());
    }
    EXPECT_THAT(others,
                ::testing::UnorderedElementsAre(b_page, c1_page, c2_page));
    EXPECT_EQ(ev.nodes_removed, 4);
    for (const InsertResult* gone : {&a, &b, &c1, &c2}) {
      EXPECT_FALSE(tree_->Inspect(gone->node).ok());
    }
    for (const InsertResult* kept : {&d, &q, &qc, &r, &rc}) {
      EXPECT_TRUE(on_device(*kept)) << kept->node;
    }
    ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();

    // 3. No progress possible: Q's subtree is locked, R's has a backup in
    //    flight, D reaches no short-lane page. Nothing is evicted.
    ev = tree_->EvictDevice(need_short(1));
    EXPECT_EQ(ev.evicted_tokens, 0);
    for (Rank l = 0; l < cp; ++l) EXPECT_THAT(ev.freed_pages[l], IsEmpty());
    EXPECT_TRUE(on_device(d));

    // 4. Unlocked, Q is reached through its child.
    ASSERT_TRUE(tree_->Unlock(qc.node).ok());
    ev = tree_->EvictDevice(need_short(1));
    EXPECT_THAT(ev.freed_pages[short_lane], ElementsAre(q_page));
    EXPECT_THAT(ev.freed_pages[0], ElementsAre(qc_page));
    EXPECT_TRUE(on_device(r));
    EXPECT_TRUE(on_device(rc));
    EXPECT_TRUE(on_device(d));
    ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  }
}

// Unlocking takes one ancestor at a time, the one whose leaves come first in
// policy order, and stops once the lane has its pages. A backed child goes
// to host; the unbacked ancestor then takes its host copy along (its KV
// could no longer be loaded without the ancestor's).
TEST_F(RadixTreeTest, UnlockingStopsAtTheFirstAncestorThatSuffices) {
  for (uint32_t cp : {2u, 4u}) {
    SCOPED_TRACE("C = " + std::to_string(cp));
    Reset(cp);
    const Rank short_lane = cp - 1;
    auto page = [&](int64_t i, Rank lane) {
      return static_cast<LogicalPage>(i * cp + lane);
    };
    // Two ancestors in the short lane, each with two lane-0 children; the
    // older branch comes first in LRU order.
    const LogicalPage old_a = page(10, short_lane);
    const LogicalPage old_c1 = page(11, 0), old_c2 = page(12, 0);
    Insert(Seq(0, 4), {old_a});
    InsertResult backed = Insert(Cat(Seq(0, 4), Seq(10, 4)), {old_a, old_c1});
    Backup(backed.node);
    Insert(Cat(Seq(0, 4), Seq(20, 4)), {old_a, old_c2});
    clock_.Advance(absl::Seconds(1));
    const LogicalPage new_a = page(20, short_lane);
    Insert(Seq(50, 4), {new_a});
    Insert(Cat(Seq(50, 4), Seq(60, 4)), {new_a, page(21, 0)});
    Insert(Cat(Seq(50, 4), Seq(70, 4)), {new_a, page(22, 0)});

    std::vector<int64_t> need(cp, 0);
    need[short_lane] = 1;
    DeviceEvictResult ev = tree_->EvictDevice(need);
    EXPECT_THAT(ev.freed_pages[short_lane], ElementsAre(old_a));
    EXPECT_THAT(ev.freed_pages[0],
                ::testing::UnorderedElementsAre(old_c1, old_c2));
    EXPECT_EQ(ev.nodes_to_host, 1);
    EXPECT_EQ(ev.nodes_removed, 2);
    // The backed child's host copy went with its unbacked ancestor.
    EXPECT_THAT(ev.freed_host_pages[0], ::testing::SizeIs(1));
    EXPECT_EQ(Match(Cat(Seq(0, 4), Seq(10, 4))).host_hit_len, 0);
    // The newer branch is whole.
    EXPECT_EQ(Match(Cat(Seq(50, 4), Seq(60, 4))).device_len, 8);
    EXPECT_EQ(Match(Cat(Seq(50, 4), Seq(70, 4))).device_len, 8);
    ASSERT_TRUE(tree_->CheckInvariants().ok()) << tree_->CheckInvariants();
  }
}

TEST_F(RadixTreeTest, HostEvictionRespectsRefsPinsAndFreesParentsLast) {
  InsertResult parent = Insert(Seq(0, 8));
  InsertResult child = Insert(Cat(Seq(0, 8), Seq(70, 4)));
  auto parent_id = *tree_->Inspect(child.node);
  Backup(parent_id.parent);
  Backup(child.node);
  tree_->EvictDeviceTokens(12);
  EXPECT_EQ(Match(Cat(Seq(0, 8), Seq(70, 4))).host_hit_len, 12);
  ASSERT_TRUE(tree_->Pin(child.node, absl::Seconds(10)).ok());
  HostEvictResult h = tree_->EvictHost({100});
  EXPECT_EQ(h.nodes_removed, 0);  // Child pinned, parent has a child.
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(tree_->AddHostRef(child.node).ok());
  EXPECT_EQ(tree_->EvictHost({100}).nodes_removed, 0);
  ASSERT_TRUE(tree_->ReleaseHostRef(child.node).ok());
  h = tree_->EvictHost({100});
  EXPECT_EQ(h.nodes_removed, 2);  // Child, then its parent.
  EXPECT_EQ(h.freed_host_pages[0].size(), 3u);
  EXPECT_EQ(tree_->Stats().nodes, 0);
  (void)parent;
}

TEST_F(RadixTreeTest, RefreshedHitExtendsPin) {
  InsertResult r = Insert(Seq(0, 4));
  Backup(r.node);
  tree_->EvictDeviceTokens(4);
  ASSERT_TRUE(tree_->Pin(r.node, absl::Seconds(10)).ok());
  clock_.Advance(absl::Seconds(8));
  Match(Seq(0, 4));  // Extends to now + 10 s.
  clock_.Advance(absl::Seconds(8));
  EXPECT_EQ(tree_->EvictHost({1}).nodes_removed, 0);
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(tree_->EvictHost({1}).nodes_removed, 1);
}

TEST_F(RadixTreeTest, LoadBackRequiresRecordedOwners) {
  Reset(2);
  InsertResult r = Insert(Seq(0, 8), {102, 105});  // Lanes 0, 1.
  Backup(r.node);
  tree_->EvictDeviceTokens(8);
  EXPECT_THAT(*tree_->HostOnlyChain(r.node), ElementsAre(r.node));
  EXPECT_THAT(tree_->AttachDevicePages(r.node, {103, 104}).message(),
              HasSubstr("not in lane 0"));
  ASSERT_TRUE(tree_->AttachDevicePages(r.node, {200, 301}).ok());
  EXPECT_EQ(Match(Seq(0, 8)).device_len, 8);
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

TEST_F(RadixTreeTest, InsertReattachesDeviceValuesToHostOnlyNodes) {
  InsertResult r = Insert(Seq(0, 8));
  Backup(r.node);
  tree_->EvictDeviceTokens(8);
  auto pages = Pages(8);
  InsertResult again = Insert(Seq(0, 8), pages);
  EXPECT_EQ(again.present_len, 0);
  EXPECT_THAT(again.duplicate_pages, IsEmpty());  // Adopted.
  EXPECT_THAT(Match(Seq(0, 8)).device_pages, ElementsAre(pages[0], pages[1]));
}

TEST_F(RadixTreeTest, BackupMetadataMustMatchTheNode) {
  Reset(2);
  InsertResult r = Insert(Seq(0, 8), {102, 105});
  EXPECT_THAT(tree_
                  ->BeginBackup(
                      r.node, *CpHostMeta::Create(8, kP, 2, {1, 0}, {{1}, {2}}))
                  .message(),
              HasSubstr("lane"));
  EXPECT_FALSE(
      tree_->BeginBackup(r.node, *CpHostMeta::Create(4, kP, 2, {0}, {{1}, {}}))
          .ok());
  EXPECT_EQ(tree_->CommitBackup(r.node).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RadixTreeTest, WriteThroughCandidatesAtThreshold) {
  Reset(1, EvictionPolicy::kLru, /*write_through_threshold=*/2);
  InsertResult r = Insert(Seq(0, 8));
  EXPECT_THAT(Match(Seq(0, 8)).write_through_candidates, IsEmpty());
  EXPECT_THAT(Match(Seq(0, 8)).write_through_candidates, ElementsAre(r.node));
  Backup(r.node);
  EXPECT_THAT(Match(Seq(0, 8)).write_through_candidates, IsEmpty());
}

TEST_F(RadixTreeTest, BadInputIsRejected) {
  auto bad = tree_->Insert("", Seq(0, 8), {1});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("needs 2 pages"));
  EXPECT_THAT(tree_->Insert("", Seq(0, 4), {-1}).status().message(),
              HasSubstr("negative"));
  EXPECT_EQ(tree_->Pin(1, absl::ZeroDuration()).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(RadixTree::Create({.page_size = 3}).ok());
}

TEST_F(RadixTreeTest, DumpFiltersByPrefixAndDepth) {
  Insert(Seq(0, 8));
  Insert(Cat(Seq(0, 8), Seq(50, 4)));
  Insert(Cat(Seq(0, 8), Seq(60, 4)));
  ASSERT_TRUE(tree_->Insert("other", Seq(0, 4), Pages(4)).ok());
  auto all = tree_->Dump({});
  EXPECT_EQ(all.size(), 4u);
  EXPECT_EQ(tree_->Dump({.ns = "", .all_namespaces = false}).size(), 3u);
  auto shallow =
      tree_->Dump({.ns = "", .all_namespaces = false, .max_depth = 1});
  ASSERT_EQ(shallow.size(), 1u);
  EXPECT_EQ(shallow[0].len, 8);
  auto prefixed = tree_->Dump(
      {.ns = "", .all_namespaces = false, .prefix = Cat(Seq(0, 8), {60})});
  ASSERT_EQ(prefixed.size(), 1u);
  EXPECT_THAT(prefixed[0].head_tokens, ElementsAre(60, 61, 62, 63));
  EXPECT_EQ(prefixed[0].start, 8);
  EXPECT_EQ(tree_->Dump({.limit = 2}).size(), 2u);
  auto detail = *tree_->Inspect(prefixed[0].id);
  EXPECT_EQ(detail.depth, 2);
  EXPECT_EQ(detail.device_pages.size(), 1u);
}

}  // namespace
}  // namespace hicache
