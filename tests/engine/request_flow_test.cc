// RequestFlow: Admit (match + lock + allocate the extend [+ backup]) and
// Complete (insert + attach + unlock + free), over a real engine and
// SessionManager (CPU backend, C = 2, P = 4).
#include "daemon/engine/request_flow.h"

#include <memory>
#include <string>
#include <vector>

#include "daemon/core/clock.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/event_mailbox.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kP = 4;

using testing::Seq;

std::vector<int32_t> Cat(std::vector<int32_t> a,
                         const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class RequestFlowTest : public ::testing::Test {
 protected:
  void Make(WritePolicy policy, int64_t device_pages = 16,
            int64_t load_threshold = 0, int64_t host_pages = 64) {
    EngineOptions options;
    options.page_size = kP;
    options.cp_size = 2;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = device_pages;
    options.host_pages_per_rank = host_pages;
    options.write_policy = policy;
    options.load_back_threshold_tokens = load_threshold;
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1));
    engine_->SetListener(&hub_);
    flow_ = std::make_unique<RequestFlow>(sessions_.get(), engine_.get(),
                                          &hub_);
    auto info = sessions_->Open("test", SessionRole::kScheduler, 0, "",
                                absl::Minutes(1));
    ASSERT_TRUE(info.ok());
    id_ = info->id;
  }

  AdmitResult AdmitOne(const std::vector<int32_t>& tokens, int64_t reserve = 0,
                       BackupChoice backup = BackupChoice::kAuto) {
    auto results = flow_->Admit(
        id_, {AdmitItem{.tokens = tokens, .reserve_tokens = reserve,
                        .backup = backup}});
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? results->front() : AdmitResult{};
  }

  // The request's pages: the hit's, then the new ones.
  static std::vector<LogicalPage> PagesOf(const AdmitResult& a) {
    std::vector<LogicalPage> pages = a.hit.match.device_pages;
    pages.insert(pages.end(), a.pages.begin(), a.pages.end());
    return pages;
  }

  // Stores every layer of `backup` (as the workers would).
  void StoreLayers(uint64_t backup) {
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      ASSERT_TRUE(sessions_->LayerStored(id_, {backup}, s).ok());
    }
  }

  SessionInsertResult CompleteOne(const std::vector<int32_t>& tokens,
                                  const AdmitResult& a,
                                  std::vector<LogicalPage> free_pages = {}) {
    std::vector<LogicalPage> pages = PagesOf(a);
    pages.resize((tokens.size() + kP - 1) / kP);
    CompleteItem item;
    item.insert = {.tokens = tokens, .pages = pages, .backup_id = a.backup_id};
    if (a.hit.lock_handle != 0) item.lock_handles = {a.hit.lock_handle};
    item.free_uncached = true;
    item.free_pages = std::move(free_pages);
    auto results = flow_->Complete(id_, {item});
    EXPECT_TRUE(results.ok()) << results.status();
    return results.ok() ? results->front() : SessionInsertResult{};
  }

  void ExpectNothingHeld() {
    engine_->WaitForTransfers();
    EXPECT_EQ(engine_->AllRequestPages(), 0);
    EXPECT_EQ(sessions_->totals().locks, 0);
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }

  FakeClock clock_{absl::FromUnixSeconds(100)};
  EventHub hub_;
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<RequestFlow> flow_;
  std::string id_;
};

// Seed 001, chunked prefill: a middle chunk that ends mid-page backs up
// only its whole pages, the ones its unfinished insert keeps, and its
// backup attaches. Before, the backup covered the partial tail page too,
// could never match the node the insert made, and was rolled back.
TEST_F(RequestFlowTest, MiddleChunkBacksUpOnlyItsWholePages) {
  Make(WritePolicy::kWriteThrough);
  const auto chunk1 = Seq(0, 10);
  auto r1 = flow_->Admit(id_, {AdmitItem{.tokens = chunk1, .unfinished = true}});
  ASSERT_TRUE(r1.ok()) << r1.status();
  const AdmitResult a1 = r1->front();
  ASSERT_EQ(a1.pages.size(), 3u);
  ASSERT_NE(a1.backup_id, 0u);
  StoreLayers(a1.backup_id);
  CompleteItem c1;
  c1.insert = {.tokens = chunk1,
               .pages = a1.pages,
               .unfinished = true,
               .backup_id = a1.backup_id};
  auto d1 = flow_->Complete(id_, {c1});
  ASSERT_TRUE(d1.ok()) << d1.status();
  EXPECT_EQ(d1->front().insert.cached_len, 8);
  EXPECT_TRUE(d1->front().backup_attached);
  EXPECT_EQ(engine_->Stats().backups_rolled_back, 0);
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->TreeStatistics().host_tokens, 8);
  // The final chunk: its hit ends at the page boundary; its backup covers
  // the rest, the old partial page rewritten.
  const auto all = Cat(chunk1, Seq(500, 9));
  const AdmitResult a2 = AdmitOne(all);
  EXPECT_EQ(a2.hit.match.device_len, 8);
  ASSERT_NE(a2.backup_id, 0u);
  StoreLayers(a2.backup_id);
  const SessionInsertResult r = CompleteOne(all, a2, {a1.pages[2]});
  EXPECT_EQ(r.insert.cached_len, 19);
  EXPECT_TRUE(r.backup_attached);
  // A middle chunk of less than a page backs up nothing.
  const AdmitResult small = flow_->Admit(id_, {AdmitItem{
      .tokens = Seq(900, 3), .unfinished = true}})->front();
  EXPECT_TRUE(small.admitted);
  EXPECT_EQ(small.backup_id, 0u);
  ASSERT_TRUE(sessions_->Free(id_, small.pages).ok());
  ExpectNothingHeld();
  EXPECT_EQ(engine_->Stats().backups_committed, 2);
}

// Seed 001: one Admit call (a batch) runs one host admission and eviction
// step for all of its backups, not one an item (before: each item's
// PrepareBackups evicted for itself, two steps here).
TEST_F(RequestFlowTest, AdmitRunsOneHostEvictionStepPerBatch) {
  Make(WritePolicy::kWriteThrough, /*device_pages=*/16, /*load_threshold=*/0,
       /*host_pages=*/4);
  // Fill both host pools with the copies of four finished requests.
  for (int i = 0; i < 4; ++i) {
    const auto tokens = Seq(1000 + 100 * i, 8);
    const AdmitResult a = AdmitOne(tokens);
    ASSERT_NE(a.backup_id, 0u);
    StoreLayers(a.backup_id);
    CompleteOne(tokens, a);
  }
  engine_->WaitForTransfers();
  // Host-only now: what host eviction may take.
  ASSERT_TRUE(engine_->EvictPages({100, 100}, {}).ok());
  ASSERT_EQ(engine_->HostUsedPages(0) + engine_->HostUsedPages(1), 8);
  const EngineStats before = engine_->Stats();
  auto admitted = flow_->Admit(id_, {AdmitItem{.tokens = Seq(0, 8)},
                                     AdmitItem{.tokens = Seq(200, 8)}});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const EngineStats after = engine_->Stats();
  for (const AdmitResult& a : *admitted) {
    EXPECT_TRUE(a.admitted);
    EXPECT_NE(a.backup_id, 0u);
  }
  EXPECT_EQ(after.host_eviction_steps - before.host_eviction_steps, 1);
  EXPECT_EQ(after.host_evicted_pages - before.host_evicted_pages, 4);
  for (size_t k = 0; k < 2; ++k) {
    StoreLayers((*admitted)[k].backup_id);
    CompleteOne(k == 0 ? Seq(0, 8) : Seq(200, 8), (*admitted)[k]);
  }
  ExpectNothingHeld();
}

TEST_F(RequestFlowTest, ColdRequestIsOneAdmitAndOneComplete) {
  Make(WritePolicy::kWriteThrough);
  const std::vector<int32_t> tokens = Seq(0, 10);
  AdmitResult a = AdmitOne(tokens, /*reserve=*/3);
  ASSERT_TRUE(a.admitted);
  EXPECT_FALSE(a.load);
  EXPECT_EQ(a.hit.lock_handle, 0u);
  EXPECT_EQ(a.pages.size(), 4u);  // ceil(13 / 4).
  ASSERT_NE(a.backup_id, 0u);     // write_through: the daemon backs it up.
  StoreLayers(a.backup_id);
  SessionInsertResult r =
      CompleteOne(tokens, a, /*free_pages=*/{a.pages.back()});
  EXPECT_EQ(r.insert.cached_len, 10);
  EXPECT_TRUE(r.backup_attached);
  ExpectNothingHeld();
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
}

// Namespace quotas (docs/quotas.md) at Admit, under the daemon's write
// policy at C = 2: a request its namespace's device limit cannot hold waits,
// as one the pool cannot hold does (not admitted, nothing held); once the
// namespace's own cache makes room under the limit, it is admitted.
TEST_F(RequestFlowTest, AdmitWaitsAtTheNamespacesDeviceLimit) {
  Make(EngineOptions{}.write_policy, /*device_pages=*/33);
  ASSERT_TRUE(engine_->SetNamespaceQuota({.ns = "", .device_limit = 6}).ok());
  // 7 pages: more than the limit allows.
  AdmitResult too_big = AdmitOne(Seq(0, 28));
  EXPECT_FALSE(too_big.admitted);
  ExpectNothingHeld();
  EXPECT_EQ(engine_->Stats().quota_refusals, 1);
  // 4 pages, cached; then 4 more: the first request's pages make room.
  const std::vector<int32_t> first = Seq(100, 16);
  AdmitResult a = AdmitOne(first);
  ASSERT_TRUE(a.admitted);
  if (a.backup_id != 0) StoreLayers(a.backup_id);
  CompleteOne(first, a);
  engine_->WaitForTransfers();
  AdmitResult b = AdmitOne(Seq(200, 16));
  ASSERT_TRUE(b.admitted);
  const auto usage = engine_->NamespaceQuotas();
  ASSERT_EQ(usage.size(), 1u);
  EXPECT_LE(usage[0].device_cached_pages + usage[0].device_request_pages, 6);
  EXPECT_EQ(usage[0].device_request_pages, 4);
}

// Nobody streams an Admit backup, so its namespace's workers hear it.
TEST_F(RequestFlowTest, WorkersHearTheBackupsAdmitPrepares) {
  Make(WritePolicy::kWriteThrough);
  auto box = std::make_shared<EventMailbox>(1024, [] {});
  const uint64_t subscription = hub_.Subscribe(/*rank=*/1, "", box);
  AdmitResult a = AdmitOne(Seq(0, 8));
  ASSERT_NE(a.backup_id, 0u);
  StoreLayers(a.backup_id);
  CompleteOne(Seq(0, 8), a);
  engine_->WaitForTransfers();
  int steps = 0;
  bool committed = false;
  while (std::optional<OpEvent> e = box->Wait(absl::Now() + absl::Seconds(5))) {
    ASSERT_EQ(e->op, a.backup_id);
    if (e->type == OpEvent::Type::kBackupStep) {
      EXPECT_EQ(e->rank, 1u);
      ++steps;
    }
    if (e->type == OpEvent::Type::kCommitted) {
      committed = true;
      break;
    }
  }
  EXPECT_EQ(steps, static_cast<int>(engine_->geometry().NumSteps()));
  EXPECT_TRUE(committed);
  hub_.Unsubscribe(subscription);
  hub_.Forget(a.backup_id);
}

TEST_F(RequestFlowTest, AutoBackupFollowsTheWritePolicy) {
  Make(WritePolicy::kWriteBack);
  AdmitResult a = AdmitOne(Seq(0, 8));
  EXPECT_EQ(a.backup_id, 0u);
  AdmitResult forced = AdmitOne(Seq(100, 8), 0, BackupChoice::kAlways);
  EXPECT_NE(forced.backup_id, 0u);
  ASSERT_TRUE(sessions_->Rollback(id_, forced.backup_id).ok());
  forced.backup_id = 0;
  CompleteOne(Seq(0, 8), a);
  CompleteOne(Seq(100, 8), forced);
  ExpectNothingHeld();
}

TEST_F(RequestFlowTest, HitIsLockedAndOnlyTheExtendIsAllocated) {
  Make(WritePolicy::kWriteThroughSelective);
  AdmitResult first = AdmitOne(Seq(0, 8));
  CompleteOne(Seq(0, 8), first);
  AdmitResult second = AdmitOne(Seq(0, 14));
  ASSERT_TRUE(second.admitted);
  EXPECT_EQ(second.hit.match.device_len, 8);
  EXPECT_NE(second.hit.lock_handle, 0u);
  EXPECT_EQ(second.pages.size(), 2u);  // ceil(14 / 4) - 2.
  EXPECT_EQ(sessions_->totals().locks, 1);
  SessionInsertResult r = CompleteOne(Seq(0, 14), second);
  EXPECT_EQ(r.insert.cached_len, 14);
  ExpectNothingHeld();
}

// Issue 12 item 8: turn 1 ends mid-page; turn 2 extends it. The hit floors to
// the page boundary, the backup of the extension attaches, and the whole
// turn is cached (with P = 4 and C = 2, lanes of both ranks).
TEST_F(RequestFlowTest, MultiTurnExtensionPastAPartialTailIsCached) {
  Make(WritePolicy::kWriteThrough);
  const std::vector<int32_t> turn1 = Seq(0, 10);
  AdmitResult a1 = AdmitOne(turn1);
  StoreLayers(a1.backup_id);
  ASSERT_TRUE(CompleteOne(turn1, a1).backup_attached);
  // Turn 2 = turn 1 + answer + new question, once turn 1's backup is on host
  // (while it is in flight its node cannot be split: tail_blocked, see
  // DeferredCompleteKeepsLocksAndPagesForTheRetry).
  engine_->WaitForTransfers();
  const std::vector<int32_t> turn2 = Cat(turn1, Seq(500, 9));
  AdmitResult a2 = AdmitOne(turn2);
  ASSERT_TRUE(a2.admitted);
  EXPECT_EQ(a2.hit.match.device_len, 8);  // Floored: the tail is recomputed.
  EXPECT_FALSE(a2.hit.match.tail_blocked);
  ASSERT_NE(a2.backup_id, 0u);
  StoreLayers(a2.backup_id);
  SessionInsertResult r = CompleteOne(turn2, a2);
  EXPECT_EQ(r.insert.cached_len, 19);
  EXPECT_TRUE(r.backup_attached);
  ExpectNothingHeld();
  EXPECT_EQ(engine_->Stats().backups_committed, 2);
  auto match = engine_->Match("", turn2, /*peek=*/true);
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->device_len, 19);
}

// The same while another request still holds turn 1's tail (it is decoding
// on it): the extension goes beside the tail and is cached all the same.
TEST_F(RequestFlowTest, ExtensionIsCachedWhileAnotherRequestLocksTheTail) {
  Make(WritePolicy::kWriteThrough);
  const std::vector<int32_t> turn1 = Seq(0, 10);
  AdmitResult a1 = AdmitOne(turn1);
  StoreLayers(a1.backup_id);
  CompleteOne(turn1, a1);
  engine_->WaitForTransfers();
  auto other = sessions_->Match(id_, {turn1}, /*lock=*/true, /*peek=*/false,
                                /*exact_tail=*/true);
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(other->front().match.device_len, 10);  // Holds the exact tail.
  const std::vector<int32_t> turn2 = Cat(turn1, Seq(500, 9));
  AdmitResult a2 = AdmitOne(turn2);
  ASSERT_NE(a2.backup_id, 0u);
  StoreLayers(a2.backup_id);
  SessionInsertResult r = CompleteOne(turn2, a2);
  EXPECT_EQ(r.insert.cached_len, 19);
  EXPECT_TRUE(r.backup_attached);
  ASSERT_TRUE(
      sessions_->UnlockHandles(id_, {other->front().lock_handle}).ok());
  ExpectNothingHeld();
}

TEST_F(RequestFlowTest, FirstItemThatDoesNotFitAndTheRestAreNotAdmitted) {
  Make(WritePolicy::kWriteBack, /*device_pages=*/4);  // 3 usable per lane.
  auto results = flow_->Admit(
      id_, {AdmitItem{.tokens = Seq(0, 16)}, AdmitItem{.tokens = Seq(100, 16)},
            AdmitItem{.tokens = Seq(200, 4)}});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_TRUE((*results)[0].admitted);
  EXPECT_FALSE((*results)[1].admitted);
  EXPECT_FALSE((*results)[2].admitted);  // It would fit: FCFS all the same.
  EXPECT_THAT((*results)[1].pages, IsEmpty());
  EXPECT_EQ(engine_->AllRequestPages(), 4);
  CompleteOne(Seq(0, 16), (*results)[0]);
  ExpectNothingHeld();
}

TEST_F(RequestFlowTest, HostHitAboveTheThresholdAsksForALoad) {
  Make(WritePolicy::kWriteThrough, 16, /*load_threshold=*/4);
  AdmitResult a = AdmitOne(Seq(0, 8));
  StoreLayers(a.backup_id);
  CompleteOne(Seq(0, 8), a);
  engine_->WaitForTransfers();
  auto evicted = engine_->EvictPages({100, 100}, {});
  ASSERT_TRUE(evicted.ok());
  AdmitResult again = AdmitOne(Seq(0, 12));
  ASSERT_TRUE(again.admitted);
  EXPECT_TRUE(again.load);
  EXPECT_EQ(again.hit.match.host_hit_len, 8);
  EXPECT_THAT(again.pages, IsEmpty());
  EXPECT_EQ(again.backup_id, 0u);
  ExpectNothingHeld();
}

TEST_F(RequestFlowTest, BadRequestsChangeNothing) {
  Make(WritePolicy::kWriteBack);
  EXPECT_THAT(flow_->Admit(id_, {AdmitItem{.tokens = {}}}).status().message(),
              HasSubstr("empty"));
  EXPECT_THAT(flow_->Admit(id_, {AdmitItem{.tokens = Seq(0, 4),
                                           .reserve_tokens = -1}})
                  .status()
                  .message(),
              HasSubstr("reserve_tokens"));
  EXPECT_EQ(flow_->Admit(id_, {AdmitItem{.tokens = Seq(0, 4),
                                         .reserve_tokens = 1 << 20}})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(flow_->Admit("nope", {AdmitItem{.tokens = Seq(0, 4)}})
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  AdmitResult a = AdmitOne(Seq(0, 8));
  // A repeated or foreign handle, a foreign page: refused before the insert.
  CompleteItem item;
  item.insert = {.tokens = Seq(0, 8), .pages = a.pages};
  item.lock_handles = {12345};
  EXPECT_EQ(flow_->Complete(id_, {item}).status().code(),
            absl::StatusCode::kNotFound);
  item.lock_handles.clear();
  item.free_pages = {a.pages[0]};  // Also inserted.
  EXPECT_THAT(flow_->Complete(id_, {item}).status().message(),
              HasSubstr("also inserts"));
  item.free_pages = {999};
  EXPECT_EQ(flow_->Complete(id_, {item}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->TreeDevicePages(), 0);  // Nothing was inserted.
  CompleteOne(Seq(0, 8), a);
  ExpectNothingHeld();
}

// A bad item anywhere in the call changes nothing, not even the good items
// before it (found by tests/integration/stream_abuse_regression_test).
TEST_F(RequestFlowTest, CompleteIsAllOrNothingAcrossItems) {
  Make(WritePolicy::kWriteBack);
  AdmitResult one = AdmitOne(Seq(0, 8));
  AdmitResult two = AdmitOne(Seq(100, 8));
  auto complete_item = [](const std::vector<int32_t>& tokens,
                          const AdmitResult& a) {
    CompleteItem item;
    item.insert = {.tokens = tokens, .pages = PagesOf(a)};
    item.free_uncached = true;
    return item;
  };
  CompleteItem good = complete_item(Seq(0, 8), one);
  CompleteItem foreign = complete_item(Seq(100, 8), two);
  foreign.insert.pages = {999, 998};  // Not the session's.
  EXPECT_EQ(flow_->Complete(id_, {good, foreign}).status().code(),
            absl::StatusCode::kInvalidArgument);
  CompleteItem frees_other = complete_item(Seq(100, 8), two);
  frees_other.free_pages = {one.pages[0]};  // Item 0 inserts it.
  EXPECT_THAT(flow_->Complete(id_, {good, frees_other}).status().message(),
              HasSubstr("also inserts"));
  CompleteItem same_pages = complete_item(Seq(200, 8), one);
  EXPECT_THAT(flow_->Complete(id_, {good, same_pages}).status().message(),
              HasSubstr("another item's"));
  EXPECT_EQ(engine_->TreeDevicePages(), 0);  // Nothing was inserted.
  EXPECT_EQ(engine_->AllRequestPages(), 4);
  // A page to free that a backup in flight still reads (found by the
  // service fuzzer: fuzz/corpus/crashes/complete_free_busy_page).
  auto busy = sessions_->PrepareBackups(id_, {BackupSpec{two.pages, 8}});
  ASSERT_TRUE(busy.ok());
  CompleteItem frees_busy = complete_item(Seq(0, 4), one);
  frees_busy.free_pages = two.pages;
  EXPECT_EQ(flow_->Complete(id_, {frees_busy}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->TreeDevicePages(), 0);
  ASSERT_TRUE(sessions_->Rollback(id_, busy->front()).ok());
  auto results = flow_->Complete(id_, {good, complete_item(Seq(100, 8), two)});
  ASSERT_TRUE(results.ok()) << results.status();
  ExpectNothingHeld();
}

TEST_F(RequestFlowTest, DeferredCompleteKeepsLocksAndPagesForTheRetry) {
  Make(WritePolicy::kWriteThrough);
  // A's backup is attached but waits for its layers: A's node is pending.
  AdmitResult a = AdmitOne(Seq(0, 12));
  ASSERT_NE(a.backup_id, 0u);
  ASSERT_TRUE(CompleteOne(Seq(0, 12), a).backup_attached);
  // B diverges inside A's node: caching it needs a split, so B is told up
  // front (tail_blocked: no backup prepared) and its Complete is deferred.
  const std::vector<int32_t> b_tokens = Cat(Seq(0, 8), Seq(900, 4));
  AdmitResult b = AdmitOne(b_tokens);
  EXPECT_EQ(b.hit.match.device_len, 8);
  EXPECT_TRUE(b.hit.match.tail_blocked);
  EXPECT_EQ(b.backup_id, 0u);
  SessionInsertResult r = CompleteOne(b_tokens, b);
  EXPECT_TRUE(r.insert.deferred);
  EXPECT_EQ(sessions_->totals().locks, 1);  // Still B's.
  EXPECT_EQ(engine_->AllRequestPages(), 1);
  // A commits; the retry goes through and releases everything.
  StoreLayers(a.backup_id);
  engine_->WaitForTransfers();
  r = CompleteOne(b_tokens, b);
  EXPECT_FALSE(r.insert.deferred);
  EXPECT_EQ(r.insert.cached_len, 12);
  ExpectNothingHeld();
}

}  // namespace
}  // namespace hicache
