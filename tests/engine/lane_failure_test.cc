// The lanes of a dead CP member (HiCacheEngine::SetLaneAvailability,
// DropLanes; docs/engine.md, "Engine: lanes of a dead member"). The engine
// serves every rank but holds pools only for its own; the other ranks'
// copies "run elsewhere" through SplitTransferEngine, which can hold their
// completions, so that copies are in flight when a lane dies. The tree's
// part alone: tests/radix/radix_tree_lanes_test.cc.
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
}  // namespace
}  // namespace lane_test
}  // namespace hicache
