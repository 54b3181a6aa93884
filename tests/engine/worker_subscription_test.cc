// WorkerSubscription: a worker session's Subscribe over a real engine (CPU
// backend, C = 2, P = 4, preset "tiny": 2 steps), a SessionManager and an
// EventHub set as the engine's listener. Backups and loads are made by a
// scheduler of the worker's namespace through BackupStream and LoadStream
// (which tag their operations for the namespace). Every event is in the
// subscription's mailbox once WaitForTransfers returns, so Next is read with
// a past deadline: no sleeps.
#include "daemon/engine/worker_subscription.h"

#include <atomic>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/core/clock.h"
#include "daemon/engine/backup_stream.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/load_stream.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/stream_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::IsEmpty;

constexpr int64_t kP = 4;
constexpr int64_t kTokens = 8;  // Two pages per request.

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class WorkerSubscriptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.page_size = kP;
    options.cp_size = 2;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = 32;
    options.host_pages_per_rank = 64;
    options.write_policy = WritePolicy::kWriteBack;  // No untagged backups.
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    engine_->SetListener(&hub_);
    SessionLimits limits;
    limits.max_streams_per_session = 2;
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1), limits);
    scheduler_ = OpenSession(SessionRole::kScheduler, 0, "ns");
    worker0_ = OpenSession(SessionRole::kWorker, 0, "ns");
    worker1_ = OpenSession(SessionRole::kWorker, 1, "ns");
  }

  std::string OpenSession(SessionRole role, Rank rank, const std::string& ns,
                          absl::Duration lease = absl::Minutes(1)) {
    auto info = sessions_->Open("test", role, rank, ns, lease);
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->id : "";
  }

  StreamContext Context(size_t max_backlog = 1024) {
    return StreamContext{.sessions = sessions_.get(),
                         .hub = &hub_,
                         .engine = engine_.get(),
                         .max_backlog = max_backlog,
                         .on_overflow = [this] { ++overflows_; }};
  }

  std::unique_ptr<WorkerSubscription> Subscribe(const std::string& session,
                                                size_t max_backlog = 1024) {
    auto subscription = WorkerSubscription::Open(Context(max_backlog), session);
    EXPECT_TRUE(subscription.ok()) << subscription.status();
    return subscription.ok() ? *std::move(subscription) : nullptr;
  }

  // One backup of `scheduler`'s through a BackupStream: prepared, every
  // layer stored, attached, committed. Returns the backup id.
  uint64_t CommitABackup(const std::string& scheduler, int32_t first) {
    auto stream = BackupStream::Open(Context(), scheduler);
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return 0;
    const std::vector<int32_t> tokens = Seq(first, kTokens);
    auto pages =
        sessions_->Allocate(scheduler, {AllocationItem{.num_pages = 2}});
    EXPECT_TRUE(pages.ok()) << pages.status();
    if (!pages.ok()) return 0;
    auto ids = (*stream)->Prepare({BackupSpec{pages->front(), kTokens}});
    EXPECT_TRUE(ids.ok()) << ids.status();
    if (!ids.ok()) return 0;
    const uint64_t backup = ids->front();
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      EXPECT_TRUE((*stream)->LayerStored({backup}, s, {}).ok());
    }
    auto inserted = sessions_->Insert(
        scheduler,
        {SessionInsertItem{
            .tokens = tokens, .pages = pages->front(), .backup_id = backup}});
    EXPECT_TRUE(inserted.ok() && inserted->front().backup_attached);
    engine_->WaitForTransfers();
    (*stream)->EndOfInput(/*broken=*/false);
    while ((*stream)->NextEvent().has_value()) {
    }
    return backup;
  }

  // Loads the backed-up `tokens` of `scheduler`'s namespace back after
  // evicting them to host, through a LoadStream; returns the load id.
  uint64_t LoadBack(const std::string& scheduler, int32_t first) {
    EXPECT_TRUE(engine_->EvictPages({100, 100}, {}).ok());
    auto stream = LoadStream::Open(Context(), scheduler);
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return 0;
    auto load = (*stream)->Start(0, Seq(first, kTokens), {});
    EXPECT_TRUE(load.ok()) << load.status();
    if (!load.ok()) return 0;
    EXPECT_NE(load->op_id, 0u);
    engine_->WaitForTransfers();
    while (std::optional<LoadStream::Event> event =
               (*stream)->Next(absl::InfinitePast())) {
      if (event->kind == LoadStream::Event::Kind::kDone) {
        EXPECT_TRUE(event->ok);
        EXPECT_TRUE(
            sessions_->UnlockHandles(scheduler, {event->lock_handle}).ok());
      }
    }
    return load->op_id;
  }

  // Every event waiting in the subscription (none is on its way once
  // WaitForTransfers returned).
  static std::vector<OpEvent> Pending(WorkerSubscription& subscription) {
    std::vector<OpEvent> events;
    while (std::optional<OpEvent> event =
               subscription.Next(absl::InfinitePast())) {
      events.push_back(*event);
    }
    return events;
  }

  using Seen =
      std::multiset<std::tuple<OpEvent::Type, uint64_t, Rank, uint32_t>>;
  // (type, op, rank, step) of each event; step 0 for outcomes.
  static Seen Summary(const std::vector<OpEvent>& events) {
    Seen seen;
    for (const OpEvent& e : events) {
      const bool per_layer = e.type == OpEvent::Type::kBackupStep ||
                             e.type == OpEvent::Type::kLoadStep;
      seen.insert({e.type, e.op, e.rank, per_layer ? e.step : 0});
    }
    return seen;
  }

  FakeClock clock_{absl::FromUnixSeconds(100)};
  EventHub hub_;
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  std::string scheduler_;
  std::string worker0_;
  std::string worker1_;
  std::atomic<int> overflows_{0};
};

TEST_F(WorkerSubscriptionTest, SchedulerSessionsAreRefused) {
  auto refused = WorkerSubscription::Open(Context(), scheduler_);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      WorkerSubscription::Open(Context(), "no-such-session").status().code(),
      absl::StatusCode::kNotFound);
  // The refusal took none of the scheduler's stream slots.
  auto a = BackupStream::Open(Context(), scheduler_);
  auto b = BackupStream::Open(Context(), scheduler_);
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(b.ok()) << b.status();
}

TEST_F(WorkerSubscriptionTest, CountsAgainstTheWorkersStreamLimit) {
  std::unique_ptr<WorkerSubscription> first = Subscribe(worker1_);
  std::unique_ptr<WorkerSubscription> second = Subscribe(worker1_);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(first->rank(), 1u);
  EXPECT_EQ(WorkerSubscription::Open(Context(), worker1_).status().code(),
            absl::StatusCode::kResourceExhausted);
  first.reset();
  std::unique_ptr<WorkerSubscription> again = Subscribe(worker1_);
  EXPECT_NE(again, nullptr);
  // Another worker's slots are its own.
  std::unique_ptr<WorkerSubscription> other = Subscribe(worker0_);
  EXPECT_NE(other, nullptr);
}

// Each worker hears its own rank's per-layer events and every outcome of
// its namespace, stamped with its rank.
TEST_F(WorkerSubscriptionTest, SeesItsRanksLayersAndStampedOutcomes) {
  std::unique_ptr<WorkerSubscription> rank0 = Subscribe(worker0_);
  std::unique_ptr<WorkerSubscription> rank1 = Subscribe(worker1_);
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  const uint64_t backup = CommitABackup(scheduler_, 0);
  ASSERT_NE(backup, 0u);
  using T = OpEvent::Type;
  EXPECT_EQ(Summary(Pending(*rank1)), (Seen{{T::kBackupStep, backup, 1, 0},
                                            {T::kBackupStep, backup, 1, 1},
                                            {T::kCommitted, backup, 1, 0}}));
  EXPECT_EQ(Summary(Pending(*rank0)), (Seen{{T::kBackupStep, backup, 0, 0},
                                            {T::kBackupStep, backup, 0, 1},
                                            {T::kCommitted, backup, 0, 0}}));
  const uint64_t load = LoadBack(scheduler_, 0);
  ASSERT_NE(load, 0u);
  std::vector<OpEvent> loaded = Pending(*rank1);
  EXPECT_EQ(Summary(loaded), (Seen{{T::kLoadStep, load, 1, 0},
                                   {T::kLoadStep, load, 1, 1},
                                   {T::kLoadDone, load, 1, 0}}));
  ASSERT_FALSE(loaded.empty());
  EXPECT_EQ(loaded.back().type, T::kLoadDone);  // After its layers.
  EXPECT_TRUE(loaded.back().ok);
  EXPECT_EQ(Summary(Pending(*rank0)), (Seen{{T::kLoadStep, load, 0, 0},
                                            {T::kLoadStep, load, 0, 1},
                                            {T::kLoadDone, load, 0, 0}}));
  EXPECT_FALSE(rank1->ended());
  EXPECT_FALSE(rank1->overflowed());
}

TEST_F(WorkerSubscriptionTest, AnotherNamespacesEventsAreNotSeen) {
  const std::string stranger = OpenSession(SessionRole::kWorker, 1, "other");
  const std::string other_scheduler =
      OpenSession(SessionRole::kScheduler, 0, "other");
  std::unique_ptr<WorkerSubscription> subscription = Subscribe(stranger);
  ASSERT_NE(subscription, nullptr);
  ASSERT_NE(CommitABackup(scheduler_, 0), 0u);
  ASSERT_NE(LoadBack(scheduler_, 0), 0u);
  EXPECT_THAT(Pending(*subscription), IsEmpty());
  EXPECT_FALSE(subscription->ended());
  // Its own namespace's events do reach it.
  const uint64_t own = CommitABackup(other_scheduler, 500);
  ASSERT_NE(own, 0u);
  std::vector<OpEvent> events = Pending(*subscription);
  ASSERT_EQ(events.size(), 3u);
  for (const OpEvent& e : events) EXPECT_EQ(e.op, own);
  EXPECT_EQ(events.back().type, OpEvent::Type::kCommitted);
}

TEST_F(WorkerSubscriptionTest, EndsWhenTheSessionCloses) {
  std::unique_ptr<WorkerSubscription> subscription = Subscribe(worker1_);
  ASSERT_NE(subscription, nullptr);
  EXPECT_FALSE(subscription->Next(absl::InfinitePast()).has_value());
  EXPECT_FALSE(subscription->ended());  // A quiet deadline only.
  ASSERT_TRUE(sessions_->Close(worker1_).ok());
  EXPECT_FALSE(subscription->Next(absl::InfinitePast()).has_value());
  ASSERT_TRUE(subscription->ended());
  EXPECT_FALSE(subscription->overflowed());
  // For good: at once even with no deadline, whatever happens later.
  ASSERT_NE(CommitABackup(scheduler_, 0), 0u);
  EXPECT_FALSE(subscription->Next(absl::InfiniteFuture()).has_value());
  subscription.reset();  // Its session is gone: nothing to count back.
}

// (Reproduced a bug: the session was checked only at a quiet deadline, so a
// busy namespace kept a closed worker's subscription streaming.)
TEST_F(WorkerSubscriptionTest,
       EndsWhenTheSessionClosesWhileItsNamespaceIsBusy) {
  std::unique_ptr<WorkerSubscription> subscription = Subscribe(worker1_);
  ASSERT_NE(subscription, nullptr);
  ASSERT_TRUE(sessions_->Close(worker1_).ok());
  ASSERT_NE(CommitABackup(scheduler_, 0), 0u);  // The namespace goes on.
  std::optional<OpEvent> event = subscription->Next(absl::InfinitePast());
  EXPECT_FALSE(event.has_value())
      << "the closed session's subscription returned an event of op "
      << event->op;
  EXPECT_TRUE(subscription->ended());
}

TEST_F(WorkerSubscriptionTest, EndsWhenTheSessionsLeaseLapses) {
  const std::string short_lived =
      OpenSession(SessionRole::kWorker, 0, "ns", absl::Seconds(10));
  std::unique_ptr<WorkerSubscription> lapsing = Subscribe(short_lived);
  std::unique_ptr<WorkerSubscription> kept = Subscribe(worker1_);
  ASSERT_NE(lapsing, nullptr);
  ASSERT_NE(kept, nullptr);
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sessions_->KeepAlive(worker1_).ok());
  ASSERT_TRUE(sessions_->KeepAlive(scheduler_).ok());
  ASSERT_EQ(sessions_->ExpireLapsed(), 1);
  EXPECT_FALSE(lapsing->Next(absl::InfinitePast()).has_value());
  EXPECT_TRUE(lapsing->ended());
  EXPECT_FALSE(kept->Next(absl::InfinitePast()).has_value());
  EXPECT_FALSE(kept->ended());
}

TEST_F(WorkerSubscriptionTest, OverflowRunsOnOverflowOnceAndEnds) {
  std::unique_ptr<WorkerSubscription> subscription =
      Subscribe(worker1_, /*max_backlog=*/1);
  ASSERT_NE(subscription, nullptr);
  ASSERT_NE(CommitABackup(scheduler_, 0), 0u);  // 3 events, backlog 1.
  EXPECT_EQ(overflows_.load(), 1);
  ASSERT_TRUE(subscription->overflowed());
  EXPECT_FALSE(subscription->Next(absl::InfiniteFuture()).has_value());
  EXPECT_TRUE(subscription->ended());
  ASSERT_NE(CommitABackup(scheduler_, 100), 0u);
  EXPECT_EQ(overflows_.load(), 1);  // Once.
  EXPECT_FALSE(subscription->Next(absl::InfinitePast()).has_value());
  subscription.reset();
  // Its slot came back.
  std::unique_ptr<WorkerSubscription> a = Subscribe(worker1_);
  std::unique_ptr<WorkerSubscription> b = Subscribe(worker1_);
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
}

// A worker session is for a rank whose pools live in this engine: in a CP
// group of daemons, the other ranks' workers belong to the daemons holding
// them (docs/cp-groups.md), and here they would get no events of theirs.
TEST(WorkerSessionRankTest, AWorkerOfARankWhosePoolsAreElsewhereIsRefused) {
  EngineOptions options;
  options.page_size = kP;
  options.cp_size = 4;
  options.kv_preset = "tiny";
  options.device_pages_per_rank = 8;
  options.host_pages_per_rank = 8;
  options.pool_ranks = {0, 1};  // A CP group leader's: it serves all four.
  auto engine = HiCacheEngine::Create(options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  FakeClock clock{absl::FromUnixSeconds(100)};
  SessionManager sessions(engine->get(), &clock, absl::Minutes(1));
  EXPECT_TRUE(sessions.Open("w", SessionRole::kWorker, 1, "ns",
                            absl::Minutes(1)).ok());
  absl::StatusOr<SessionInfo> elsewhere =
      sessions.Open("w", SessionRole::kWorker, 2, "ns", absl::Minutes(1));
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(elsewhere.status().message()),
              ::testing::HasSubstr("holds ranks 0,1"));
  EXPECT_EQ(sessions.List().size(), 1u);
  // A scheduler of any rank is fine: it speaks for the whole group.
  EXPECT_TRUE(sessions.Open("s", SessionRole::kScheduler, 3, "ns",
                            absl::Minutes(1)).ok());
}

}  // namespace
}  // namespace hicache
