// The lanes of a dead CP member (HiCacheEngine::SetLaneAvailability,
// DropLanes; docs/engine.md, "Engine: lanes of a dead member"). The engine
// serves every rank but holds pools only for its own; the other ranks'
// copies "run elsewhere" through SplitTransferEngine, which can hold their
// completions, so that copies are in flight when a lane dies. The tree's
// part alone: tests/radix/radix_tree_lanes_test.cc.
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
namespace {

using testing::SplitTransferEngine;
using testing::VerifyKv;
using testing::WriteKv;

constexpr uint32_t kP = 4;

std::vector<int32_t> Seq(int32_t first, int n) {
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

TEST_F(LaneFailureTest, LanesOutsideTheGroupAreRefusedAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  const Rank bad[] = {0, 2};
  EXPECT_EQ(engine_->SetLanesUnavailable(bad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  EXPECT_EQ(engine_->DropLanes(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Stats().lane_drops, 0);
}

// While a lane is unavailable: loads are misses (no op started, counted),
// backups are skipped (op id 0, counted), and no match returns a page or a
// recorded owner on it. Made available again (pools intact), all works.
TEST_F(LaneFailureTest, UnavailableLaneMakesLoadsMissAndBackupsSkip) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  const std::vector<int32_t> zig = Seq(0, 16);
  const std::vector<int32_t> mine = Seq(100, 8);
  ASSERT_NE(Cache("", zig, {0, 1, 1, 0}).node, kNoNode);
  ASSERT_NE(Cache("", mine, {0, 0}).node, kNoNode);
  ASSERT_EQ(engine_->Stats().backups_committed, 2);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  // A device-only node with a page on lane 1.
  const std::vector<int32_t> dev = Seq(200, 8);
  ASSERT_NE(Cache("", dev, {0, 1}, /*backup=*/false).node, kNoNode);

  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  EXPECT_EQ(engine_->UnavailableLanes(), std::vector<Rank>{1});
  // Matches: the zigzag host copy and the lane-1 device copy are invisible;
  // the lane-0 host copy is still matched (it loads once lane 1 is back).
  EXPECT_EQ(engine_->Match("", zig, /*peek=*/true)->host_hit_len, 0);
  EXPECT_EQ(engine_->Match("", dev, /*peek=*/true)->device_len, 0);
  EXPECT_EQ(engine_->Match("", dev)->device_len, 0);
  EXPECT_EQ(engine_->Match("", mine, /*peek=*/true)->host_hit_len, 8);

  const EngineStats before = engine_->Stats();
  auto load = engine_->LoadBack("", mine);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->op_id, 0u);
  EXPECT_EQ(load->miss, LoadMissReason::kLaneUnavailable);
  EXPECT_EQ(LoadMissReasonName(load->miss), "lane_unavailable");
  ASSERT_TRUE(engine_->Unlock(load->node).ok());
  auto pages = engine_->AllocateWithOwners({0, 0});
  ASSERT_TRUE(pages.ok());
  auto ops = engine_->PrepareBackups({BackupSpec{*pages, 8}});
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(*ops, std::vector<uint64_t>{0});
  // Write-through of a twice-hit device node (lanes 0 only) is skipped too:
  // every backup waits for an ack of every served rank.
  const std::vector<int32_t> hot = Seq(300, 8);
  ASSERT_NE(Cache("", hot, {0, 0}, /*backup=*/false).node, kNoNode);
  EXPECT_EQ(engine_->Match("", hot)->device_len, 8);
  EXPECT_EQ(engine_->Match("", hot)->device_len, 8);
  engine_->WaitForTransfers();
  const EngineStats after = engine_->Stats();
  EXPECT_EQ(after.loads_started, before.loads_started);
  EXPECT_EQ(after.load_misses_lane_unavailable, 1);
  EXPECT_EQ(after.load_misses, before.load_misses + 1);
  EXPECT_EQ(after.backups_started, before.backups_started);
  EXPECT_GE(after.backups_skipped_lane_unavailable, 2);
  ExpectInvariants();

  // A lane made available again (its pools intact: no drop) serves again.
  ASSERT_TRUE(engine_->SetLanesAvailable(one).ok());
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  auto loaded = engine_->LoadBack("", mine);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE(loaded->op_id, 0u);
  engine_->WaitForTransfers();
  ASSERT_TRUE(*engine_->LoadDone(loaded->op_id));
  EXPECT_TRUE(VerifyKv(*engine_, mine, loaded->pages, 8).ok());
  ASSERT_TRUE(engine_->FinishLoad(loaded->op_id).ok());
  ASSERT_TRUE(engine_->Free(*pages).ok());
  ExpectInvariants();
}

// C = 4, ranks 2 and 3 remote; lane 3 dies. Zigzag nodes touch every lane
// and go, with their subtrees; nodes wholly on other lanes stay and load
// back byte-exact once the lane is readmitted.
TEST_F(LaneFailureTest, DropLanesRemovesExactlyWhatTouchesTheLanes) {
  ASSERT_NO_FATAL_FAILURE(Make(4, {0, 1}));
  const CpLayout& layout = engine_->layout();
  const std::vector<int32_t> zig = Seq(0, 32);  // 8 pages, zigzag: all lanes.
  const Cached z = Cache("", zig, ZigzagComputeOwners(8, 4));
  // Host-only survivor on lanes 0 and 1.
  const std::vector<int32_t> keep = Seq(5000, 16);
  const Cached kept = Cache("", keep, {0, 1, 1, 0});
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  // A parent on lane 3 with a child wholly on lanes 0 and 1.
  std::vector<int32_t> parent_key = Seq(1000, 8);
  std::vector<int32_t> child_key = parent_key;
  for (int32_t t : Seq(2000, 8)) child_key.push_back(t);
  const Cached parent = Cache("", parent_key, {3, 3});
  auto child_pages = engine_->AllocateWithOwners({0, 1});
  ASSERT_TRUE(child_pages.ok());
  std::vector<LogicalPage> both = parent.pages;
  both.insert(both.end(), child_pages->begin(), child_pages->end());
  auto child = engine_->Insert("", child_key, both);
  ASSERT_TRUE(child.ok()) << child.status();
  // A device-only survivor on lanes 0 and 2, and a lane-3 node in another
  // namespace (which goes).
  const std::vector<int32_t> dev = Seq(6000, 8);
  const Cached d = Cache("", dev, {2, 0}, /*backup=*/false);
  const Cached other = Cache("tenant", Seq(7000, 4), {3}, /*backup=*/false);
  ExpectInvariants();
  const int64_t nodes_before = engine_->TreeStatistics().nodes;
  const int64_t host_before[] = {engine_->HostUsedPages(0),
                                 engine_->HostUsedPages(1),
                                 engine_->HostUsedPages(2),
                                 engine_->HostUsedPages(3)};
  ASSERT_EQ(host_before[3], 2 + 2);  // The zigzag node's and the parent's.

  const Rank three[] = {3};
  ASSERT_TRUE(engine_->SetLanesUnavailable(three).ok());
  auto counts = engine_->DropLanes(three);
  ASSERT_TRUE(counts.ok()) << counts.status();
  // Gone: the zigzag node, the lane-3 parent and its child, the tenant's.
  EXPECT_EQ(counts->nodes_removed, 4);
  EXPECT_EQ(counts->nodes_detached, 0);
  EXPECT_EQ(counts->backups_failed + counts->loads_failed, 0);
  EXPECT_EQ(counts->request_pages_tainted, 0);
  EXPECT_EQ(counts->host_pages_freed, 8 + 2);
  EXPECT_EQ(counts->device_pages_freed, 2 + 2 + 1);  // Parent, child, tenant.
  EXPECT_EQ(engine_->TreeStatistics().nodes, nodes_before - 4);
  for (Rank r = 0; r < 4; ++r) {
    const int64_t zig_pages = 2;  // Zigzag over 8 pages: 2 per lane.
    const int64_t parent_pages = r == 3 ? 2 : 0;
    EXPECT_EQ(engine_->HostUsedPages(r),
              host_before[r] - zig_pages - parent_pages)
        << "rank " << r;
  }
  EXPECT_EQ(engine_->Inspect(z.node).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->Inspect(child->node).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->Inspect(other.node).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(engine_->Inspect(kept.node).ok());
  EXPECT_TRUE(engine_->Inspect(d.node).ok());
  ExpectNothingOn({3});
  EXPECT_EQ(engine_->Match("", zig, true)->host_hit_len, 0);
  EXPECT_EQ(engine_->Match("", zig, true)->device_len, 0);
  EXPECT_EQ(engine_->Match("", child_key, true)->device_len, 0);
  EXPECT_EQ(engine_->Match("", dev, true)->device_len, 8);
  EXPECT_EQ(engine_->Stats().lane_drops, 1);
  EXPECT_EQ(engine_->Stats().lane_nodes_removed, 4);
  ExpectInvariants();
  // Dropping again finds nothing.
  auto again = engine_->DropLanes(three);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->nodes_removed + again->nodes_detached, 0);

  // Readmitted (fresh pools): the survivor loads back byte-exact.
  ASSERT_TRUE(engine_->SetLanesAvailable(three).ok());
  auto load = engine_->LoadBack("", keep);
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_NE(load->op_id, 0u) << LoadMissReasonName(load->miss);
  engine_->WaitForTransfers();
  ASSERT_TRUE(*engine_->LoadDone(load->op_id));
  EXPECT_EQ(load->loaded_len, 16);
  EXPECT_TRUE(VerifyKv(*engine_, keep, load->pages, 16).ok());
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  EXPECT_EQ(layout.LaneOf(load->pages[0]), 0u);
  ExpectInvariants();
}

// A locked node on a dead lane is never matched after the drop (nor can it
// be locked again or inspected) and disappears, its pages freed, when its
// last lock goes. Its unlocked child goes at once.
TEST_F(LaneFailureTest, LockedNodeIsNeverMatchedAndGoesOnUnlock) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  const std::vector<int32_t> key = Seq(0, 16);
  const Cached a = Cache("", key, {0, 1, 1, 0});
  std::vector<int32_t> longer = key;
  for (int32_t t : Seq(500, 8)) longer.push_back(t);
  auto tail = engine_->AllocateWithOwners({0, 0});
  ASSERT_TRUE(tail.ok());
  std::vector<LogicalPage> all = a.pages;
  all.insert(all.end(), tail->begin(), tail->end());
  auto leaf = engine_->Insert("", longer, all);
  ASSERT_TRUE(leaf.ok());
  auto hit = engine_->Match("", key, /*peek=*/false, /*lock=*/true);
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit->device_len, 16);
  const NodeId locked = hit->last_device_node;
  const int64_t allocated = engine_->DeviceAllocatedPages();
  ASSERT_EQ(allocated, 6);

  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  EXPECT_EQ(engine_->Match("", key, true)->device_len, 0);  // Already.
  auto counts = engine_->DropLanes(one);
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->nodes_detached, 1);
  EXPECT_EQ(counts->nodes_removed, 1);  // The unlocked leaf below it.
  EXPECT_EQ(counts->device_pages_freed, 2);
  EXPECT_EQ(counts->host_pages_freed, 0);  // Held with the node until then.
  EXPECT_EQ(engine_->DeviceAllocatedPages(), 4);  // The locked node's.
  EXPECT_EQ(engine_->TreeStatistics().nodes, 0);
  EXPECT_TRUE(engine_->Dump({}).empty());
  ExpectInvariants();
  // Readmitted before the unlock: still never served.
  ASSERT_TRUE(engine_->SetLanesAvailable(one).ok());
  EXPECT_EQ(engine_->Match("", key, true)->device_len, 0);
  EXPECT_EQ(engine_->Match("", key, true)->host_hit_len, 0);
  EXPECT_EQ(engine_->LoadBack("", key)->device_len, 0);
  EXPECT_EQ(engine_->Lock(locked).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->Inspect(locked).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->Pin(locked, absl::Seconds(1)).code(),
            absl::StatusCode::kFailedPrecondition);
  // The lock holder's insert passing the dropped node's pages back is
  // refused (nothing changes), saying why.
  auto extend = engine_->AllocateWithOwners({0});
  ASSERT_TRUE(extend.ok());
  std::vector<LogicalPage> passed = a.pages;
  passed.push_back((*extend)[0]);
  std::vector<int32_t> extended = key;
  for (int32_t t : Seq(800, 4)) extended.push_back(t);
  auto refused = engine_->Insert("", extended, passed);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("dropped with the lanes"),
            std::string::npos)
      << refused.status();
  ASSERT_TRUE(engine_->Free(*extend).ok());
  ExpectInvariants();

  // Its namespace's root stays while the lock walks up to it.
  const Cached tenant = Cache("t", Seq(40, 4), {1}, /*backup=*/false);
  auto tenant_hit = engine_->Match("t", Seq(40, 4), false, /*lock=*/true);
  ASSERT_TRUE(tenant_hit.ok());
  ASSERT_EQ(tenant_hit->last_device_node, tenant.node);
  auto tenant_drop = engine_->DropLanes(one);
  ASSERT_TRUE(tenant_drop.ok());
  EXPECT_EQ(tenant_drop->nodes_detached, 1);
  EXPECT_FALSE(engine_->DropNamespaceIfEmpty("t"));
  ASSERT_TRUE(engine_->Unlock(tenant.node).ok());
  EXPECT_TRUE(engine_->DropNamespaceIfEmpty("t"));

  ASSERT_TRUE(engine_->Unlock(locked).ok());
  EXPECT_EQ(engine_->DeviceAllocatedPages(), 0);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->HostUsedPages(1), 0);
  EXPECT_EQ(engine_->Stats().lane_nodes_removed, 3);  // Leaf, tenant, it.
  EXPECT_EQ(engine_->Unlock(locked).code(), absl::StatusCode::kNotFound);
  ExpectInvariants();
  // The same tokens cache again, end to end (lane 1 readmitted).
  const Cached again = Cache("", key, {0, 1, 1, 0});
  EXPECT_EQ(engine_->Match("", key, true)->device_len, 16);
  EXPECT_EQ(engine_->Stats().backups_committed, 2);
  ExpectInvariants();
}

// Request pages on a dead lane stay the request's, but are never cached:
// Insert caches only what comes before the first of them; PrepareBackups
// skips them; once freed, the pages are ordinary again.
TEST_F(LaneFailureTest, RequestPagesOnADeadLaneAreNeverCached) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  const std::vector<int32_t> key = Seq(0, 16);
  auto pages = engine_->AllocateWithOwners({0, 1, 0, 1}, /*holder=*/7);
  ASSERT_TRUE(pages.ok());
  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  auto counts = engine_->DropLanes(one);
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->request_pages_tainted, 2);
  EXPECT_EQ(engine_->RequestPages(7), 4);
  ASSERT_TRUE(engine_->SetLanesAvailable(one).ok());
  // Still tainted after readmission: its bytes were on the dead pool.
  auto ops = engine_->PrepareBackups({BackupSpec{*pages, 16}}, 7);
  ASSERT_TRUE(ops.ok());
  EXPECT_EQ(*ops, std::vector<uint64_t>{0});
  auto inserted = engine_->Insert("", key, *pages, {}, 7);
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  EXPECT_EQ(inserted->cached_len, 4);
  EXPECT_EQ(inserted->uncached_pages,
            std::vector<LogicalPage>(pages->begin() + 1, pages->end()));
  EXPECT_EQ(engine_->RequestPages(7), 3);
  EXPECT_EQ(engine_->Match("", key, true)->device_len, 4);
  EXPECT_EQ(engine_->Stats().inserts_cut_by_lanes, 1);
  ExpectInvariants();
  // The first page tainted: nothing cached at all.
  auto second = engine_->AllocateWithOwners({0}, 7);
  ASSERT_TRUE(second.ok());
  const std::vector<LogicalPage> lead = {(*pages)[1], (*second)[0]};
  auto none = engine_->Insert("x", Seq(50, 8), lead, {}, 7);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->cached_len, 0);
  EXPECT_EQ(none->uncached_pages, lead);
  EXPECT_EQ(engine_->Match("x", Seq(50, 8), true)->device_len, 0);
  ExpectInvariants();
  // Freed, the pages are ordinary again.
  ASSERT_EQ(engine_->FreeAllOf(7), 4);
  auto fresh = engine_->AllocateWithOwners({1, 1, 1, 1, 1, 1, 1, 1}, 7);
  ASSERT_TRUE(fresh.ok());
  std::vector<int32_t> key2 = Seq(900, 32);
  auto cached = engine_->Insert("", key2, *fresh, {}, 7);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->cached_len, 32);
  EXPECT_TRUE(cached->uncached_pages.empty());
  ExpectInvariants();
}

// Pages a request took on a dead lane after the drop (before readmission)
// were never written to the fresh pool: readmission taints them.
TEST_F(LaneFailureTest, PagesAllocatedBeforeReadmissionAreNeverCached) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  ASSERT_TRUE(engine_->DropLanes(one).ok());
  auto pages = engine_->AllocateWithOwners({0, 1});
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(engine_->SetLanesAvailable(one).ok());
  auto inserted = engine_->Insert("", Seq(0, 8), *pages);
  ASSERT_TRUE(inserted.ok());
  EXPECT_EQ(inserted->cached_len, 4);
  EXPECT_EQ(inserted->uncached_pages, std::vector<LogicalPage>{(*pages)[1]});
  ASSERT_TRUE(engine_->Free(inserted->uncached_pages).ok());
  // Available again without a drop in between (pools intact): no taint.
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  auto more = engine_->AllocateWithOwners({1});
  ASSERT_TRUE(more.ok());
  ASSERT_TRUE(engine_->SetLanesAvailable(one).ok());
  auto cached = engine_->Insert("", Seq(100, 4), *more);
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached->cached_len, 4);
  ExpectInvariants();
}

// An Insert while a lane is unavailable (not yet dropped) caches nothing
// from its first page on that lane on.
TEST_F(LaneFailureTest, InsertWhileALaneIsUnavailableStopsAtItsFirstPage) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  auto pages = engine_->AllocateWithOwners({0, 0, 1, 0});
  ASSERT_TRUE(pages.ok());
  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  auto inserted = engine_->Insert("", Seq(0, 16), *pages);
  ASSERT_TRUE(inserted.ok());
  EXPECT_EQ(inserted->cached_len, 8);
  EXPECT_EQ(inserted->uncached_pages.size(), 2u);
  ASSERT_TRUE(engine_->Free(inserted->uncached_pages).ok());
  ExpectInvariants();
}

// Write-back while a lane is unavailable: the victims' backups are not
// started (they would wait on the dead rank's ack), so eviction removes them
// uncopied and the allocation neither waits nor fails.
TEST_F(LaneFailureTest, WriteBackStagesNothingWhileALaneIsUnavailable) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}, /*device_pages=*/8, /*host_pages=*/64,
                               WritePolicy::kWriteBack));
  ASSERT_NE(Cache("", Seq(0, 12), {0, 0, 0}, /*backup=*/false).node, kNoNode);
  ASSERT_NE(Cache("", Seq(50, 12), {0, 0, 0}, /*backup=*/false).node,
            kNoNode);
  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  auto pages = engine_->AllocateWithOwners({0, 0, 0, 0, 0, 0});
  ASSERT_TRUE(pages.ok()) << pages.status();
  const EngineStats stats = engine_->Stats();
  EXPECT_EQ(stats.backups_started, 0);
  EXPECT_GE(stats.backups_skipped_lane_unavailable, 1);
  EXPECT_GE(stats.device_victims_removed, 1);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  ASSERT_TRUE(engine_->Free(*pages).ok());
  ExpectInvariants();
}

// A load whose allocation waits for write-back copies (the engine lock
// released) while the lane dies: when it resumes it is a miss
// (kLaneUnavailable), frees what it allocated, and the node it was to load,
// detached meanwhile, goes with its host reference.
TEST_F(LaneFailureTest, LoadWaitingForWriteBackWhileTheLaneDiesIsAMiss) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}, /*device_pages=*/8, /*host_pages=*/64,
                               WritePolicy::kWriteBack));
  const std::vector<int32_t> key = Seq(0, 8);
  ASSERT_NE(Cache("", key, {0, 1}).node, kNoNode);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ASSERT_EQ(engine_->Match("", key, true)->host_hit_len, 8);
  // The device tier full of one unbacked node: the load's allocation must
  // write it back first.
  std::vector<Rank> owners(7, 0);
  owners.insert(owners.end(), 7, 1);
  ASSERT_NE(Cache("", Seq(100, 56), owners, /*backup=*/false).node, kNoNode);
  const int steps = static_cast<int>(engine_->geometry().NumSteps());
  split_->Hold();
  const int queued_before = split_->remote_steps();
  std::promise<absl::StatusOr<LoadResult>> loaded;
  std::thread loader([&] { loaded.set_value(engine_->LoadBack("", key)); });
  // The write-back's remote copies are queued: the loader waits for them,
  // the engine lock released.
  split_->AwaitQueued(steps);
  ASSERT_EQ(split_->remote_steps() - queued_before, steps);
  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  auto counts = engine_->DropLanes(one);
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->nodes_detached, 1);  // The node being loaded.
  EXPECT_EQ(counts->backups_failed, 1);  // The write-back.
  split_->Release();
  auto load = loaded.get_future().get();
  loader.join();
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->op_id, 0u);
  EXPECT_EQ(load->miss, LoadMissReason::kLaneUnavailable);
  EXPECT_EQ(load->device_len, 0);
  engine_->WaitForTransfers();
  ASSERT_TRUE(engine_->Unlock(load->node).ok());
  EXPECT_EQ(engine_->TreeStatistics().nodes, 0);
  EXPECT_EQ(engine_->DeviceAllocatedPages(), 0);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->HostUsedPages(1), 0);
  ExpectInvariants();
}

// Copies in flight on the dead lane: the backup never commits, the load is
// a miss (ABORTED, its node detached until the copies end), and when the
// held completions arrive everything is freed.
TEST_F(LaneFailureTest, InFlightBackupAndLoadOnADeadLaneFail) {
  ASSERT_NO_FATAL_FAILURE(Make(2, {0}));
  const std::vector<int32_t> loaded_key = Seq(0, 16);
  ASSERT_NE(Cache("", loaded_key, {0, 1, 0, 1}).node, kNoNode);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  const int steps = static_cast<int>(engine_->geometry().NumSteps());

  split_->Hold();
  // A backup, attached, its remote copies held.
  const std::vector<int32_t> key = Seq(100, 16);
  auto pages = engine_->AllocateWithOwners({1, 0, 0, 1});
  ASSERT_TRUE(pages.ok());
  auto ops = engine_->PrepareBackups({BackupSpec{*pages, 16}});
  ASSERT_TRUE(ops.ok());
  ASSERT_NE((*ops)[0], 0u);
  for (uint32_t s = 0; s < static_cast<uint32_t>(steps); ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  auto inserted = engine_->Insert("", key, *pages);
  ASSERT_TRUE(inserted.ok());
  ASSERT_TRUE(engine_->AttachBackup((*ops)[0], inserted->node).ok());
  // A load of the zigzag node, its remote copies held.
  auto load = engine_->LoadBack("", loaded_key);
  ASSERT_TRUE(load.ok());
  ASSERT_NE(load->op_id, 0u);
  split_->AwaitQueued(2 * steps);

  const Rank one[] = {1};
  ASSERT_TRUE(engine_->SetLanesUnavailable(one).ok());
  auto counts = engine_->DropLanes(one);
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->backups_failed, 1);
  EXPECT_EQ(counts->loads_failed, 1);
  EXPECT_EQ(counts->nodes_removed, 1);   // The backed-up node.
  EXPECT_EQ(counts->nodes_detached, 1);  // The node being loaded.
  EXPECT_EQ(engine_->LoadDone(load->op_id).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(engine_->Match("", key, true)->device_len, 0);
  EXPECT_EQ(engine_->Match("", loaded_key, true)->host_hit_len, 0);
  ExpectInvariants();

  split_->Release();
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->Stats().backups_committed, 1);  // Only the first.
  EXPECT_EQ(engine_->LoadDone(load->op_id).status().code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  // The failed backup was attached with every step stored: settled.
  EXPECT_EQ(engine_->RollbackBackup((*ops)[0]).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->DeviceAllocatedPages(), 0);
  EXPECT_EQ(engine_->HostUsedPages(0), 0);
  EXPECT_EQ(engine_->HostUsedPages(1), 0);
  EXPECT_EQ(engine_->TreeStatistics().nodes, 0);
  ExpectInvariants();

  // Readmitted: a zigzag backup and load run end to end; the local lane's
  // bytes come back exactly, the remote lane's copies complete through the
  // decorator.
  ASSERT_TRUE(engine_->SetLanesAvailable(one).ok());
  const std::vector<int32_t> fresh_key = Seq(300, 16);
  const int remote_before = split_->remote_steps();
  const Cached fresh = Cache("", fresh_key, {0, 1, 1, 0});
  ASSERT_NE(fresh.node, kNoNode);
  std::map<int, std::string> bytes;
  for (int i : {0, 3}) bytes[i] = PageBytes(fresh.pages[i]);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  auto back = engine_->LoadBack("", fresh_key);
  ASSERT_TRUE(back.ok());
  ASSERT_NE(back->op_id, 0u) << LoadMissReasonName(back->miss);
  engine_->WaitForTransfers();
  ASSERT_TRUE(*engine_->LoadDone(back->op_id));
  ASSERT_EQ(back->pages.size(), 4u);
  for (int i : {0, 3}) {
    ASSERT_TRUE(Local(back->pages[i]));
    EXPECT_EQ(PageBytes(back->pages[i]), bytes[i]) << "page " << i;
  }
  EXPECT_EQ(split_->remote_steps() - remote_before, 2 * steps);
  ASSERT_TRUE(engine_->FinishLoad(back->op_id).ok());
  ExpectInvariants();
}

// Model-style: random inserts (random owners), backups, loads and locks;
// then a random set of lanes dies. Afterwards the invariants hold, no
// reachable node has a page or owner on a dead lane, no match returns one,
// and once every lock is released nothing detached is left.
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
}  // namespace hicache
