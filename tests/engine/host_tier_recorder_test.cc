// HostTierRecorder: a real RadixTree reporting to it, a real journal in a
// temporary state directory, and host pool bytes in memory. What a fresh load
// of the journal holds equals the tree's host tier (VisitHostTier), with the
// checksums of the bytes the pages hold; a node dropped before its checksums
// were taken is never recorded.
#include "daemon/engine/host_tier_recorder.h"

#include <unistd.h>

#include <algorithm>
#include <future>
#include <thread>
#include <chrono>
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "daemon/core/clock.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/persist/state_dir.h"
#include "daemon/pool/page_checksum.h"
#include "daemon/pool/page_key_store.h"
#include "daemon/pool/persistent_host_segment.h"
#include "daemon/radix/radix_tree.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::hicache::testing::Seq;

constexpr uint32_t kP = 4;
constexpr int64_t kHostPages = 256;

class RecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto geometry = KvGeometry::Preset("tiny", kP);
    ASSERT_TRUE(geometry.ok()) << geometry.status();
    geometry_ = *geometry;
    bytes_.assign(geometry_.PoolBytes(kHostPages), 0);
    std::mt19937 rng(1);
    for (uint8_t& b : bytes_) b = static_cast<uint8_t>(rng());
    journal_geometry_ = {.page_size = kP,
                         .cp_size = 1,
                         .kv_fingerprint = 42,
                         .host_layout = "layer_first",
                         .host_pages_per_rank = kHostPages,
                         .instance = "t"};
    ASSERT_TRUE(persist::PrepareStateDir(dir_.path()).ok());
    auto writer = persist::JournalWriter::Open(dir_.path(), journal_geometry_, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    writer_ = *std::move(writer);
    auto tree = RadixTree::Create(
        {.page_size = kP, .cp_size = 1, .policy = EvictionPolicy::kTinyLfu,
         .clock = &clock_});
    ASSERT_TRUE(tree.ok());
    tree_ = *std::move(tree);
    auto keys = PageKeyStore::Open({.prefix = prefix_,
                                    .num_ranks = 1,
                                    .pages_per_rank = kHostPages,
                                    .page_size = kP,
                                    .fingerprint = 42});
    ASSERT_TRUE(keys.ok()) << keys.status();
    keys_ = *std::move(keys);
  }
  void TearDown() override {
    recorder_.reset();
    keys_.reset();
    RemovePersistentHostSegments(prefix_);
  }
  void StartRecorder(std::function<void()> before_event = {},
                     int64_t max_queued_pages = int64_t{1} << 22,
                     absl::Duration settle = absl::Milliseconds(20)) {
    recorder_ = std::make_unique<HostTierRecorder>(HostTierRecorder::Options{
        .geometry = geometry_,
        .layout = HostLayout::kLayerFirst,
        .host_pages_per_rank = kHostPages,
        .pools = {{.rank = 0, .bytes = bytes_}},
        .journal = writer_.get(),
        .keys = keys_.get(),
        .settle = settle,
        .max_queued_pages = max_queued_pages,
        .before_event = std::move(before_event)});
    tree_->SetHostTierListener(recorder_.get());
  }
  std::vector<LogicalPage> Pages(int64_t tokens) {
    std::vector<LogicalPage> pages((tokens + kP - 1) / kP);
    for (auto& p : pages) p = next_page_++;
    return pages;
  }
  // Backs up `node` with free host pages (a simple free list).
  bool Backup(NodeId node) {
    auto info = tree_->Inspect(node);
    if (!info.ok()) return false;
    std::vector<std::vector<int64_t>> host(1);
    for (size_t i = 0; i < info->page_owners.size(); ++i) {
      if (free_.empty()) return false;
      host[0].push_back(free_.back());
      free_.pop_back();
    }
    auto meta = CpHostMeta::Create(info->len, kP, 1, info->page_owners, host);
    if (!meta.ok() || !tree_->BeginBackup(node, *meta).ok()) return false;
    return tree_->CommitBackup(node).ok();
  }
  // Evicts up to `pages` pages from the device, then from the host (their
  // host pages freed and reused).
  void EvictBothTiers(int64_t pages) {
    Free(tree_->EvictDevice(std::vector<int64_t>{pages}).freed_host_pages);
    Free(tree_->EvictHost(std::vector<int64_t>{pages}).freed_host_pages);
  }
  // The recorder, flushed, detached and released: no token block is kept
  // from reuse for it any more.
  void ExpectEveryKeyBlockFreeOnceDetached() {
    tree_->SetHostTierListener(nullptr);
    tree_->ReleaseKeyHolds(*recorder_);
    EXPECT_EQ(tree_->key_blocks_quarantined(), 0);
  }
  void Free(const std::vector<std::vector<int64_t>>& pages) {
    for (const auto& rank : pages) {
      for (int64_t p : rank) {
        free_.push_back(p);
        // A freed page is reused: its bytes change.
        const uint64_t offset = geometry_.HostOffset(HostLayout::kLayerFirst,
                                                     kHostPages, p, 0, 0);
        bytes_[offset] ^= 0xff;
      }
    }
  }
  // Loads the journal and checks every record against the tree's host tier
  // and the pool's bytes; adds the records checked to *compared.
  void CompareWithTree(int64_t* compared) {
    const persist::LoadedJournal loaded = Load();
    std::map<uint64_t, HostCommit> expected;
    std::map<uint64_t, std::vector<int32_t>> keys;
    tree_->VisitHostTier([&](const HostCommit& c) {
      expected[c.persist_id] = c;
      keys[c.persist_id] = c.KeyTokens();
    });
    for (const persist::PutRecord& put : loaded.puts) {
      auto it = expected.find(put.persist_id);
      ASSERT_NE(it, expected.end()) << put.persist_id;
      EXPECT_EQ(put.parent_persist_id, it->second.parent_persist_id);
      EXPECT_EQ(put.logical_len,
                static_cast<int64_t>(keys[put.persist_id].size()));
      EXPECT_EQ(put.host_pages[0], it->second.host->host_pages(0));
      auto sums = HostPageChecksums(geometry_, HostLayout::kLayerFirst,
                                    kHostPages, bytes_, put.host_pages[0]);
      ASSERT_TRUE(sums.ok());
      // The key is in the pages' slots, and each page's checksum covers its
      // KV bytes and its tokens.
      std::vector<int32_t> key;
      std::vector<uint64_t> want;
      for (size_t i = 0; i < put.host_pages[0].size(); ++i) {
        const size_t count = std::min<size_t>(kP, put.logical_len - i * kP);
        auto tokens = keys_->Read(0, put.host_pages[0][i], count);
        ASSERT_TRUE(tokens.ok()) << tokens.status();
        key.insert(key.end(), tokens->begin(), tokens->end());
        want.push_back(PageRecordChecksum((*sums)[i], *tokens));
      }
      EXPECT_EQ(key, keys[put.persist_id]) << "persist id " << put.persist_id;
      EXPECT_EQ(put.checksums[0], want) << "persist id " << put.persist_id;
      ++*compared;
    }
    // The loader keeps exactly what a restart can reach: chains of recorded
    // parents up to a root, none detached.
    int64_t attached = 0;
    for (const auto& [id, commit] : expected) {
      uint64_t at = id;
      bool ok = true;
      while (ok && expected.at(at).parent_persist_id != kRootParent) {
        at = expected.at(at).parent_persist_id;
        ok = at != kDetachedParent && expected.contains(at);
      }
      attached += ok;
    }
    EXPECT_EQ(static_cast<int64_t>(loaded.puts.size()), attached);
  }
  // A commit reported by hand: persist id 1000, two pages (host pages 7
  // and 8), its key in a token store of its own (the recorder reads the
  // blocks later).
  struct ManualCommit {
    TokenStore store{kP, 4 * kP};
    std::vector<TokenStore::BlockId> blocks;
    std::optional<CpHostMeta> host;
    HostCommit commit;
  };
  static std::unique_ptr<ManualCommit> TwoPageCommit() {
    auto manual = std::make_unique<ManualCommit>();
    manual->store.AllocateMany(2, &manual->blocks);
    const std::vector<int32_t> key = Seq(0, 2 * kP);
    std::copy_n(key.begin(), kP, manual->store.Data(manual->blocks[0]));
    std::copy_n(key.begin() + kP, kP, manual->store.Data(manual->blocks[1]));
    auto host = CpHostMeta::Create(2 * kP, kP, 1, {0, 0}, {{7, 8}});
    EXPECT_TRUE(host.ok()) << host.status();
    manual->host = *std::move(host);
    manual->commit = HostCommit{.persist_id = 1000,
                                .parent_persist_id = kRootParent,
                                .ns = "",
                                .key_blocks = manual->blocks,
                                .tokens = &manual->store,
                                .host = &*manual->host};
    return manual;
  }
  persist::LoadedJournal Load() {
    EXPECT_TRUE(recorder_->Flush().ok());
    auto loaded = persist::LoadJournal(dir_.path(), &journal_geometry_);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *loaded : persist::LoadedJournal{};
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  KvGeometry geometry_ = *KvGeometry::Preset("tiny", kP);
  std::vector<uint8_t> bytes_;
  persist::JournalGeometry journal_geometry_;
  ::hicache::testing::TempDir dir_;
  std::unique_ptr<persist::JournalWriter> writer_;
  const std::string prefix_ = "/hicache-rectest" + std::to_string(getpid());
  std::unique_ptr<PageKeyStore> keys_;
  std::unique_ptr<RadixTree> tree_;
  std::unique_ptr<HostTierRecorder> recorder_;
  LogicalPage next_page_ = 100;
  std::vector<int64_t> free_ = [] {
    std::vector<int64_t> pages;
    for (int64_t p = kHostPages - 1; p >= 0; --p) pages.push_back(p);
    return pages;
  }();
};

// Random inserts, matches, backups and evictions of both tiers; every 100
// steps the journal (flushed) must equal the tree's host tier, keys and
// checksums included. With a long settle window every commit waits for
// that Flush: its key is read from the tree's held blocks up to 100 steps
// later, after splits, evictions and inserts that would reuse them.
class RecorderTrafficTest : public RecorderTest,
                            public ::testing::WithParamInterface<int> {};

TEST_P(RecorderTrafficTest, JournalEqualsTheTreesHostTierWithTheBytesChecksums) {
  const absl::Duration settle = absl::Milliseconds(GetParam());
  StartRecorder({}, int64_t{1} << 22, settle);
  std::mt19937 rng(9);
  int64_t compared = 0;
  for (int step = 1; step <= 1500; ++step) {
    clock_.Advance(absl::Milliseconds(1));
    std::vector<int32_t> tokens;
    const int stem = static_cast<int>(rng() % 4);
    const int len = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < len; ++i) {
      tokens.push_back(i < 8 ? stem * 100 + i : static_cast<int32_t>(rng() % 3));
    }
    switch (rng() % 7) {
      case 0:
      case 1:
      case 2: {
        auto result = tree_->Insert("", tokens, Pages(tokens.size()));
        ASSERT_TRUE(result.ok());
        (void)Backup(result->node);
        break;
      }
      case 3:
      case 4:
        (void)tree_->MatchPrefix("", tokens);
        break;
      case 5:
        Free(tree_->EvictDevice(std::vector<int64_t>{1 + rng() % 6})
                 .freed_host_pages);
        break;
      case 6:
        Free(tree_->EvictHost(std::vector<int64_t>{1 + rng() % 4},
                              rng() % 2 == 0)
                 .freed_host_pages);
        break;
    }
    if (step % 100 == 0) {
      ASSERT_NO_FATAL_FAILURE(CompareWithTree(&compared)) << "step " << step;
    }
  }
  EXPECT_GT(compared, 100);
  EXPECT_EQ(recorder_->stats().journal_errors, 0);
  EXPECT_GT(recorder_->stats().hashed_bytes, 0u);
  if (settle > absl::Minutes(1)) {
    // Nodes went while their commits were waiting, and their keys held.
    EXPECT_GT(recorder_->stats().puts_discarded, 0);
  }
  // Every commit handled and the recorder detached: every token block kept
  // from reuse for it is free again.
  ASSERT_TRUE(recorder_->Flush().ok());
  ExpectEveryKeyBlockFreeOnceDetached();
  EXPECT_TRUE(tree_->CheckInvariants().ok());
}

INSTANTIATE_TEST_SUITE_P(Settle, RecorderTrafficTest,
                         ::testing::Values(0, 3600 * 1000),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("Immediate")
                                                  : std::string("UntilFlush");
                         });

// A commit dropped within its settle window costs no key copy, no checksum
// and no record; its key blocks are not reused until it is handled.
TEST_F(RecorderTest, ACommitDroppedWhileSettlingIsNeitherHashedNorRecorded) {
  StartRecorder({}, int64_t{1} << 22, absl::Hours(1));
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Backup(a->node));
  EvictBothTiers(2);
  ASSERT_FALSE(tree_->Inspect(a->node).ok());
  EXPECT_EQ(tree_->key_blocks_quarantined(), 2);
  // Its pages are reused by another node meanwhile (its token blocks cannot
  // be: they are in quarantine).
  auto b = tree_->Insert("", Seq(500, 8), Pages(8));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(Backup(b->node));
  const persist::LoadedJournal loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 1u);
  EXPECT_EQ(recorder_->stats().puts_discarded, 1);
  EXPECT_EQ(recorder_->stats().puts, 1);
  EXPECT_EQ(recorder_->stats().hashed_bytes, 2 * geometry_.BytesPerPage());
  int64_t compared = 0;
  ASSERT_NO_FATAL_FAILURE(CompareWithTree(&compared));
  EXPECT_EQ(compared, 1);
  // Handled: the next insert reuses a's blocks.
  EXPECT_EQ(recorder_->KeysReadThrough(), 3u);  // a, its drop, b.
  auto c = tree_->Insert("", Seq(900, 4), Pages(4));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(tree_->key_blocks_quarantined(), 0);
}

// Reproduction: a head split off a commit not yet hashed holds some of its
// pages; when that head is dropped (and its pages reused), the commit's
// checksums could cover another node's bytes, so it must be discarded. The
// recorder used to match drops against the committed id only, and recorded
// such a commit, head included, with the reused bytes' checksums.
TEST_F(RecorderTest, ADroppedHeadSplitOffAPendingCommitDiscardsIt) {
  StartRecorder({}, int64_t{1} << 22, absl::Hours(1));
  const std::unique_ptr<ManualCommit> manual = TwoPageCommit();
  recorder_->OnHostCommitted(manual->commit);
  recorder_->OnHostSplit(1000, kP, 1001);  // 1001 takes page 7.
  recorder_->OnHostDropped(1001);
  Free({{7}});  // Page 7 reused: its bytes change.
  const persist::LoadedJournal loaded = Load();
  EXPECT_TRUE(loaded.puts.empty());
  EXPECT_EQ(recorder_->stats().puts, 0);
  EXPECT_EQ(recorder_->stats().puts_discarded, 1);
  EXPECT_EQ(recorder_->stats().hashed_bytes, 0u);
  // Its key is not read, and the tree may reuse its blocks.
  EXPECT_EQ(recorder_->KeysReadThrough(), 3u);
}

// Reproduction (crash_survival_test WriteThrough under --under-load: a
// system prompt's subtree lost at restart, 9 or 30 of 33 nodes orphaned):
// a commit whose tail was dropped after a head was split off it was
// discarded whole while its worker was behind, so the head -- a shared
// prefix, still on the host tier -- was never recorded and every later
// commit below it was an orphan at recovery. The head is recorded now, from
// the commit's record (its pages were never freed), and its split is not
// journaled; a child committed below it survives a restart.
TEST_F(RecorderTest, ADroppedTailKeepsTheHeadSplitOffItsPendingCommit) {
  StartRecorder({}, int64_t{1} << 22, absl::Hours(1));
  const std::unique_ptr<ManualCommit> manual = TwoPageCommit();
  recorder_->OnHostCommitted(manual->commit);
  recorder_->OnHostSplit(1000, kP, 1001);  // 1001 takes page 7.
  // A child of the head: host pages 9 and 10.
  const std::unique_ptr<ManualCommit> child = TwoPageCommit();
  auto host = CpHostMeta::Create(2 * kP, kP, 1, {0, 0}, {{9, 10}});
  ASSERT_TRUE(host.ok()) << host.status();
  child->host = *std::move(host);
  child->commit.persist_id = 1002;
  child->commit.parent_persist_id = 1001;
  recorder_->OnHostCommitted(child->commit);
  recorder_->OnHostDropped(1000);  // The tail: page 8.
  Free({{8}});  // Reused: its bytes change.
  EXPECT_EQ(recorder_->stats().backlog_events, 4);  // Settling for an hour.
  const persist::LoadedJournal loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 2u);
  std::map<uint64_t, persist::PutRecord> puts;
  for (const persist::PutRecord& put : loaded.puts) puts[put.persist_id] = put;
  ASSERT_TRUE(puts.contains(1001));
  ASSERT_TRUE(puts.contains(1002));
  const persist::PutRecord& head = puts[1001];
  EXPECT_EQ(head.parent_persist_id, kRootParent);
  EXPECT_EQ(head.logical_len, kP);
  EXPECT_EQ(head.host_pages[0], std::vector<int64_t>({7}));
  auto sums = HostPageChecksums(geometry_, HostLayout::kLayerFirst,
                                kHostPages, bytes_, {7});
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(head.checksums[0],
            std::vector<uint64_t>({PageRecordChecksum((*sums)[0],
                                                      Seq(0, kP))}));
  EXPECT_EQ(puts[1002].parent_persist_id, 1001u);
  const HostTierRecorderStats stats = recorder_->stats();
  EXPECT_EQ(stats.backlog_events, 0);  // Flushed.
  EXPECT_EQ(stats.lag.count(), 4);     // Each event's lag, once.
  EXPECT_EQ(stats.puts, 2);
  EXPECT_EQ(stats.puts_cut, 1);
  EXPECT_EQ(stats.puts_discarded, 0);
  EXPECT_EQ(stats.journal_errors, 0);  // The split was not journaled.
}

// A cut commit's first part takes the parent it was reparented to since its
// commit (the journal ignores a Reparent of the dropped id).
TEST_F(RecorderTest, ACutCommitsFirstPartKeepsItsNewParent) {
  StartRecorder({}, int64_t{1} << 22, absl::Hours(1));
  const std::unique_ptr<ManualCommit> parent = TwoPageCommit();
  auto host = CpHostMeta::Create(2 * kP, kP, 1, {0, 0}, {{11, 12}});
  ASSERT_TRUE(host.ok()) << host.status();
  parent->host = *std::move(host);
  parent->commit.persist_id = 900;
  const std::unique_ptr<ManualCommit> manual = TwoPageCommit();
  manual->commit.parent_persist_id = kDetachedParent;
  recorder_->OnHostCommitted(manual->commit);  // 1000, detached.
  recorder_->OnHostCommitted(parent->commit);  // 900, a root.
  recorder_->OnHostReparented(1000, 900);
  recorder_->OnHostSplit(1000, kP, 1001);
  recorder_->OnHostDropped(1000);
  Free({{8}});
  const persist::LoadedJournal loaded = Load();
  std::map<uint64_t, persist::PutRecord> puts;
  for (const persist::PutRecord& put : loaded.puts) puts[put.persist_id] = put;
  ASSERT_EQ(puts.size(), 2u);
  ASSERT_TRUE(puts.contains(1001));
  EXPECT_EQ(puts[1001].parent_persist_id, 900u);
  EXPECT_EQ(recorder_->stats().journal_errors, 0);
}

// A split of a pending commit whose head survives is recorded whole: the
// journal then holds the head and the tail.
TEST_F(RecorderTest, ASplitOfAPendingCommitWithNoDropIsRecorded) {
  StartRecorder({}, int64_t{1} << 22, absl::Hours(1));
  const std::unique_ptr<ManualCommit> manual = TwoPageCommit();
  recorder_->OnHostCommitted(manual->commit);
  recorder_->OnHostSplit(1000, kP, 1001);
  const persist::LoadedJournal loaded = Load();
  EXPECT_EQ(loaded.puts.size(), 2u);
  EXPECT_EQ(recorder_->stats().puts, 1);
  EXPECT_EQ(recorder_->stats().puts_discarded, 0);
}

// Events wait for their settle window; a Flush takes them at once.
TEST_F(RecorderTest, CommitsWaitForTheirSettleWindowUnlessFlushed) {
  StartRecorder({}, int64_t{1} << 22, absl::Hours(1));
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Backup(a->node));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(recorder_->stats().events, 0);
  ASSERT_TRUE(recorder_->Flush().ok());
  EXPECT_EQ(recorder_->stats().events, 1);
  EXPECT_EQ(recorder_->stats().puts, 1);
}

// The worker handles a settled event by itself, with no Flush.
TEST_F(RecorderTest, SettledCommitsAreRecordedWithoutAFlush) {
  auto handled = std::make_shared<std::promise<void>>();
  auto once = std::make_shared<std::atomic<bool>>(false);
  StartRecorder(
      [handled, once] {
        if (!once->exchange(true)) handled->set_value();
      },
      int64_t{1} << 22, absl::Milliseconds(10));
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Backup(a->node));
  EXPECT_EQ(handled->get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  ASSERT_TRUE(recorder_->Flush().ok());
  EXPECT_EQ(recorder_->stats().puts, 1);
  EXPECT_EQ(Load().puts.size(), 1u);
}

// A head split off a commit and dropped *while* the worker hashes it (after
// its batch was taken): the worker learns of the drop from what it takes
// after hashing, and discards the commit.
TEST_F(RecorderTest, AHeadDroppedWhileItsCommitIsHashedDiscardsIt) {
  auto in_step = std::make_shared<std::promise<void>>();
  auto injected = std::make_shared<std::promise<void>>();
  std::shared_future<void> go = injected->get_future().share();
  auto once = std::make_shared<std::atomic<bool>>(false);
  StartRecorder(
      [in_step, go, once] {
        if (once->exchange(true)) return;
        in_step->set_value();
        go.wait();
      },
      int64_t{1} << 22, absl::ZeroDuration());
  const std::unique_ptr<ManualCommit> manual = TwoPageCommit();
  recorder_->OnHostCommitted(manual->commit);
  // The worker has taken the commit, judged it live, and is about to hash.
  ASSERT_EQ(in_step->get_future().wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  recorder_->OnHostSplit(1000, kP, 1001);  // 1001 takes page 7.
  recorder_->OnHostDropped(1001);
  Free({{7}});  // Page 7 reused: its bytes change.
  injected->set_value();
  EXPECT_TRUE(Load().puts.empty());
  EXPECT_EQ(recorder_->stats().puts, 0);
  EXPECT_EQ(recorder_->stats().puts_discarded, 1);
}

// A worker so far behind that its events pass max_queued_events stops
// recording: nothing more is queued, every commit not journaled yet is
// discarded, and the journal holds only what was durable before.
TEST_F(RecorderTest, AnOverrunRecorderStopsRecordingSafely) {
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  recorder_ = std::make_unique<HostTierRecorder>(HostTierRecorder::Options{
      .geometry = geometry_,
      .layout = HostLayout::kLayerFirst,
      .host_pages_per_rank = kHostPages,
      .pools = {{.rank = 0, .bytes = bytes_}},
      .journal = writer_.get(),
      .keys = keys_.get(),
      .settle = absl::ZeroDuration(),
      .max_queued_events = 4,
      .before_event = [started] { started.wait(); }});
  tree_->SetHostTierListener(recorder_.get());
  for (int i = 0; i < 6; ++i) {  // Six roots of two pages each.
    auto node = tree_->Insert("", Seq(1000 * (i + 1), 8), Pages(8));
    ASSERT_TRUE(node.ok());
    ASSERT_TRUE(Backup(node->node));
  }
  EXPECT_GT(recorder_->stats().events_refused, 0);
  go.set_value();
  ASSERT_TRUE(recorder_->Flush().ok());
  EXPECT_EQ(recorder_->stats().puts, 0);
  EXPECT_TRUE(Load().puts.empty());
  // And it stays so: a later commit is not recorded either.
  auto later = tree_->Insert("", Seq(90000, 8), Pages(8));
  ASSERT_TRUE(later.ok());
  ASSERT_TRUE(Backup(later->node));
  ASSERT_TRUE(recorder_->Flush().ok());
  EXPECT_TRUE(Load().puts.empty());
  ExpectEveryKeyBlockFreeOnceDetached();
}

// The commit is reported, then the node is dropped (and its pages reused)
// before the worker takes its checksums: nothing of it is recorded.
TEST_F(RecorderTest, ANodeDroppedBeforeItsChecksumsIsNeverRecorded) {
  // A std::promise, not absl::Notification: Debian's Abseil is not built
  // for TSan, which would then not see this hand-over.
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  StartRecorder([started] { started.wait(); });
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(Backup(a->node));
  EvictBothTiers(2);
  ASSERT_FALSE(tree_->Inspect(a->node).ok());  // Gone, pages reused.
  go.set_value();
  const persist::LoadedJournal loaded = Load();
  EXPECT_TRUE(loaded.puts.empty());
  EXPECT_EQ(recorder_->stats().puts_discarded, 1);
  EXPECT_EQ(recorder_->stats().puts, 0);
}

// A recorder that falls behind (its worker held here) queues at most
// max_queued_pages of commits; past that a commit is not recorded, and the
// rest of the journal is unaffected, including later events naming it.
TEST_F(RecorderTest, ABacklogPastItsBoundLeavesCommitsUnrecorded) {
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  StartRecorder([started] { started.wait(); }, /*max_queued_pages=*/4);
  std::vector<NodeId> nodes;
  for (int i = 0; i < 3; ++i) {  // Three roots of two pages each.
    auto node = tree_->Insert("", Seq(1000 * (i + 1), 8), Pages(8));
    ASSERT_TRUE(node.ok());
    ASSERT_TRUE(Backup(node->node));
    nodes.push_back(node->node);
  }
  EXPECT_EQ(recorder_->stats().puts_refused, 1);
  go.set_value();
  ASSERT_TRUE(recorder_->Flush().ok());
  std::vector<uint64_t> ids;
  for (const persist::PutRecord& put : Load().puts) ids.push_back(put.persist_id);
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(recorder_->stats().puts, 2);
  // Every node's host copy goes, the refused one's too: the journal ends
  // empty and no drop was an error.
  EvictBothTiers(6);
  for (NodeId node : nodes) EXPECT_FALSE(tree_->Inspect(node).ok());
  ASSERT_TRUE(recorder_->Flush().ok());
  EXPECT_TRUE(Load().puts.empty());
  EXPECT_EQ(recorder_->stats().journal_errors, 0);
}

// A refused commit's key is never read, so its token blocks are not kept
// from reuse: what the tree keeps for the recorder is bounded by what the
// recorder has queued, however long its worker is held up.
TEST_F(RecorderTest, ARefusedCommitsKeyBlocksAreNotKept) {
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  StartRecorder([started] { started.wait(); }, /*max_queued_pages=*/4,
                absl::ZeroDuration());
  for (int i = 0; i < 3; ++i) {  // Three roots of two pages each.
    auto node = tree_->Insert("", Seq(1000 * (i + 1), 8), Pages(8));
    ASSERT_TRUE(node.ok());
    ASSERT_TRUE(Backup(node->node));
  }
  EXPECT_EQ(recorder_->stats().puts_refused, 1);
  EvictBothTiers(6);
  // The two queued commits' blocks wait for the worker; the refused one's
  // are free already.
  EXPECT_EQ(tree_->key_blocks_quarantined(), 4);
  go.set_value();
  ASSERT_TRUE(recorder_->Flush().ok());
  ExpectEveryKeyBlockFreeOnceDetached();
}

// Flush waits for the events reported before it only: a steady stream of
// later events (here drops of unknown ids, from another thread, with the
// worker slowed down) cannot starve it. It once waited for an empty queue.
// A backlog longer than the worker's batch (1024 events) is handled in
// order, a batch at a time, and a second round of commits (refilling the
// records the worker handed back) is recorded as exactly as the first.
TEST_F(RecorderTest, ABacklogLongerThanABatchIsRecordedInOrder) {
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  StartRecorder([started] { started.wait(); });
  constexpr int kNodes = 60;  // Two pages each, children of the root.
  int64_t events = 0;
  for (int round = 0; round < 2; ++round) {
    std::vector<NodeId> nodes;
    for (int i = 0; i < kNodes; ++i) {
      auto node = tree_->Insert(
          "", Seq(100000 * (round + 1) + 1000 * i, 2 * kP), Pages(2 * kP));
      ASSERT_TRUE(node.ok());
      ASSERT_TRUE(Backup(node->node));
      ++events;
      // Drops of ids the journal never saw, to pass a batch's length.
      for (int d = 0; d < 30; ++d) {
        recorder_->OnHostDropped(uint64_t{1} << 40 | (events << 8) | d);
        ++events;
      }
      nodes.push_back(node->node);
    }
    if (round == 0) go.set_value();
    ASSERT_TRUE(recorder_->Flush().ok());
    int64_t compared = 0;
    ASSERT_NO_FATAL_FAILURE(CompareWithTree(&compared));
    EXPECT_EQ(compared, kNodes) << "round " << round;
    EXPECT_EQ(recorder_->stats().puts, kNodes * (round + 1));
    EXPECT_EQ(recorder_->stats().events, events);
    EXPECT_EQ(recorder_->stats().journal_errors, 0);
    // Every host copy goes before the next round reuses the pages.
    const int64_t dropped = static_cast<int64_t>(nodes.size());
    EvictBothTiers(4 * kNodes);
    for (NodeId node : nodes) ASSERT_FALSE(tree_->Inspect(node).ok());
    events += dropped;
    ASSERT_TRUE(recorder_->Flush().ok());
    EXPECT_TRUE(Load().puts.empty());
  }
}

TEST_F(RecorderTest, FlushIsNotStarvedByLaterEvents) {
  StartRecorder([] { std::this_thread::sleep_for(std::chrono::microseconds(50)); });
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    for (uint64_t id = 1000000; !stop.load(); ++id) {
      recorder_->OnHostDropped(id);
      std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto flushed = std::async(std::launch::async, [&] { return recorder_->Flush(); });
  const bool done =
      flushed.wait_for(std::chrono::seconds(40)) == std::future_status::ready;
  stop.store(true);
  producer.join();
  ASSERT_TRUE(done) << "Flush starved by later events";
  EXPECT_TRUE(flushed.get().ok());
}

// A detached record is reparented when its parent gets a host copy, and a
// split of a recorded node reaches the journal as two records.
TEST_F(RecorderTest, SplitsAndReparentsReachTheJournal) {
  StartRecorder();
  auto a = tree_->Insert("", Seq(0, 8), Pages(8));
  auto b = tree_->Insert("", Seq(0, 16), Pages(16));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(Backup(b->node));  // Detached: a has no host copy.
  EXPECT_EQ(Load().puts.size(), 0u);
  ASSERT_TRUE(Backup(a->node));  // b reparented under a.
  EXPECT_EQ(Load().puts.size(), 2u);
  // Diverge inside a's host copy: a splits.
  std::vector<int32_t> other = Seq(0, 4);
  for (int32_t t : Seq(700, 8)) other.push_back(t);
  ASSERT_TRUE(tree_->Insert("", other, Pages(other.size())).ok());
  const persist::LoadedJournal loaded = Load();
  EXPECT_EQ(loaded.puts.size(), 3u);
  int64_t total = 0;
  for (const auto& put : loaded.puts) total += put.logical_len;
  EXPECT_EQ(total, 16);
}

}  // namespace
}  // namespace hicache
