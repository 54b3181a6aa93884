// BackupStream: one BackupSession stream's backups over a real engine (CPU
// backend, C = 2, P = 4, preset "tiny": 2 steps, so a backup has 4 per-rank
// step events), a SessionManager and an EventHub set as the engine's
// listener. Copies are held back where a test needs them in flight
// (FaultyTransferEngine::HoldWhen), never waited for with sleeps.
#include "daemon/engine/backup_stream.h"

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/clock.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/stream_context.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr int64_t kP = 4;
constexpr int64_t kTokens = 8;  // Two pages per request.

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A request's computed KV: its tokens and the session's pages holding them.
struct Request {
  std::vector<int32_t> tokens;
  std::vector<LogicalPage> pages;
  BackupSpec spec() const { return {pages, kTokens}; }
};

class BackupStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.page_size = kP;
    options.cp_size = 2;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = 32;
    options.host_pages_per_rank = 64;
    // No backup starts on its own: every backup is one a stream prepared.
    options.write_policy = WritePolicy::kWriteBack;
    options.wrap_transfer = [this](TransferListener* listener,
                                   const TransferEngineFactory& backend) {
      auto faults = std::make_unique<FaultyTransferEngine>(listener, backend);
      faults_ = faults.get();
      return faults;
    };
    auto engine = HiCacheEngine::Create(options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    engine_->SetListener(&hub_);
    SessionLimits limits;
    limits.max_streams_per_session = 2;
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1), limits);
    auto info = sessions_->Open("scheduler", SessionRole::kScheduler, 0, "ns",
                                absl::Minutes(1));
    ASSERT_TRUE(info.ok()) << info.status();
    id_ = info->id;
  }

  StreamContext Context(size_t max_backlog = 1024) {
    return StreamContext{.sessions = sessions_.get(),
                         .hub = &hub_,
                         .engine = engine_.get(),
                         .max_backlog = max_backlog,
                         .on_overflow = [this] { ++overflows_; }};
  }

  std::unique_ptr<BackupStream> OpenStream(size_t max_backlog = 1024) {
    auto stream = BackupStream::Open(Context(max_backlog), id_);
    EXPECT_TRUE(stream.ok()) << stream.status();
    return stream.ok() ? *std::move(stream) : nullptr;
  }

  Request Compute(int32_t first) {
    Request r{Seq(first, kTokens), {}};
    auto pages = sessions_->Allocate(id_, {AllocationItem{.num_pages = 2}});
    EXPECT_TRUE(pages.ok()) << pages.status();
    if (pages.ok()) r.pages = pages->front();
    return r;
  }

  // Inserts the request with its backup attached; returns the node.
  NodeId InsertWithBackup(const Request& r, uint64_t backup) {
    auto inserted = sessions_->Insert(
        id_, {SessionInsertItem{
                 .tokens = r.tokens, .pages = r.pages, .backup_id = backup}});
    EXPECT_TRUE(inserted.ok()) << inserted.status();
    if (!inserted.ok()) return kNoNode;
    EXPECT_TRUE(inserted->front().backup_attached);
    return inserted->front().insert.node;
  }

  void StoreSteps(BackupStream& stream, uint64_t backup, uint32_t from,
                  uint32_t to) {
    for (uint32_t s = from; s < to; ++s) {
      ASSERT_TRUE(stream.LayerStored({backup}, s, {}).ok());
    }
  }
  uint32_t Steps() const { return engine_->geometry().NumSteps(); }

  // Device-to-host completions wait until ReleaseCopies: the engine sees
  // those copies in flight.
  void HoldCopies() {
    faults_->HoldWhen([](const TransferSite& site) {
      return site.direction == TransferDirection::kDeviceToHost;
    });
  }
  void ReleaseCopies() {
    faults_->HoldWhen(nullptr);
    faults_->Drain();
    engine_->WaitForTransfers();
  }

  // NextEvent, bounded: a stream that should have an event (or have ended)
  // but blocks fails the test instead of hanging it.
  static std::optional<OpEvent> NextOrFail(BackupStream& stream) {
    auto next =
        std::async(std::launch::async, [&] { return stream.NextEvent(); });
    if (next.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      ADD_FAILURE() << "NextEvent blocked";
      stream.EndOfInput(/*broken=*/true);  // Ends what is open.
    }
    return next.get();
  }

  // Every event until NextEvent ends.
  static std::vector<OpEvent> Drain(BackupStream& stream) {
    std::vector<OpEvent> events;
    while (std::optional<OpEvent> event = NextOrFail(stream)) {
      events.push_back(*event);
      if (events.size() > 1000) {
        ADD_FAILURE() << "NextEvent does not end";
        break;
      }
    }
    return events;
  }

  // The outcome of every backup in `events` (Type per op).
  static std::map<uint64_t, OpEvent::Type> Outcomes(
      const std::vector<OpEvent>& events) {
    std::map<uint64_t, OpEvent::Type> outcomes;
    for (const OpEvent& e : events) {
      if (e.type == OpEvent::Type::kCommitted ||
          e.type == OpEvent::Type::kRolledBack) {
        EXPECT_TRUE(outcomes.emplace(e.op, e.type).second)
            << "two outcomes for backup " << e.op;
      }
    }
    return outcomes;
  }

  // (rank, step) of `backup`'s step events.
  static std::multiset<std::pair<Rank, uint32_t>> StepsOf(
      const std::vector<OpEvent>& events, uint64_t backup) {
    std::multiset<std::pair<Rank, uint32_t>> steps;
    for (const OpEvent& e : events) {
      if (e.type == OpEvent::Type::kBackupStep && e.op == backup) {
        steps.insert({e.rank, e.step});
      }
    }
    return steps;
  }

  int64_t HostUsed() const {
    return engine_->HostUsedPages(0) + engine_->HostUsedPages(1);
  }

  // Closes the session (it frees what it still holds) and checks that the
  // engine is left consistent with nothing held for a request.
  void CloseAndExpectNothingHeld() {
    ASSERT_TRUE(sessions_->Close(id_).ok());
    engine_->WaitForTransfers();
    EXPECT_EQ(engine_->AllRequestPages(), 0);
    EXPECT_EQ(sessions_->totals().locks, 0);
    const absl::Status invariants = engine_->CheckInvariants();
    EXPECT_TRUE(invariants.ok()) << invariants;
  }

  FakeClock clock_{absl::FromUnixSeconds(100)};
  EventHub hub_;
  std::unique_ptr<HiCacheEngine> engine_;
  FaultyTransferEngine* faults_ = nullptr;  // Owned by engine_.
  std::unique_ptr<SessionManager> sessions_;
  std::string id_;
  std::atomic<int> overflows_{0};
};

const std::multiset<std::pair<Rank, uint32_t>> kAllSteps = {
    {0, 0}, {0, 1}, {1, 0}, {1, 1}};

TEST_F(BackupStreamTest, OpenCountsAgainstTheSessionsStreamLimit) {
  EXPECT_EQ(BackupStream::Open(Context(), "no-such-session").status().code(),
            absl::StatusCode::kNotFound);
  std::unique_ptr<BackupStream> first = OpenStream();
  std::unique_ptr<BackupStream> second = OpenStream();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->session(), id_);
  EXPECT_EQ(BackupStream::Open(Context(), id_).status().code(),
            absl::StatusCode::kResourceExhausted);
  first.reset();  // Its slot comes back.
  auto third = BackupStream::Open(Context(), id_);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(BackupStream::Open(Context(), id_).status().code(),
            absl::StatusCode::kResourceExhausted);
  second.reset();
  third->reset();
  std::unique_ptr<BackupStream> a = OpenStream();
  std::unique_ptr<BackupStream> b = OpenStream();
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
}

// The writer is already blocked in NextEvent when the client stores a
// layer: the copies' completion wakes it (no polling).
TEST_F(BackupStreamTest, StepDoneWakesABlockedWriter) {
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request r = Compute(0);
  auto ids = stream->Prepare({r.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_THAT(*ids, ::testing::SizeIs(1));
  const uint64_t backup = ids->front();
  ASSERT_NE(backup, 0u);
  EXPECT_EQ(hub_.claimed(), 1u);
  auto writer =
      std::async(std::launch::async, [&] { return stream->NextEvent(); });
  ASSERT_TRUE(stream->LayerStored({backup}, 0, {}).ok());
  ASSERT_EQ(writer.wait_for(std::chrono::seconds(30)),
            std::future_status::ready)
      << "no step_done reached the blocked writer";
  std::optional<OpEvent> first = writer.get();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->type, OpEvent::Type::kBackupStep);
  EXPECT_EQ(first->op, backup);
  EXPECT_EQ(first->step, 0u);
  std::optional<OpEvent> second = NextOrFail(*stream);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->type, OpEvent::Type::kBackupStep);
  EXPECT_EQ(second->step, 0u);
  EXPECT_NE(second->rank, first->rank);  // One event per rank's copy.
  stream->EndOfInput(/*broken=*/false);  // Step 1 never stored: rolled back.
  std::vector<OpEvent> rest = Drain(*stream);
  EXPECT_THAT(Outcomes(rest),
              ElementsAre(Pair(backup, OpEvent::Type::kRolledBack)));
  stream.reset();
  EXPECT_EQ(hub_.claimed(), 0u);
  CloseAndExpectNothingHeld();
}

TEST_F(BackupStreamTest, CommittedBackupAndEndOfInputEndTheStream) {
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request r = Compute(0);
  auto ids = stream->Prepare({r.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t backup = ids->front();
  const NodeId node = InsertWithBackup(r, backup);
  StoreSteps(*stream, backup, 0, Steps());
  engine_->WaitForTransfers();
  std::vector<OpEvent> events;
  for (int i = 0; i < 5; ++i) {
    std::optional<OpEvent> event = NextOrFail(*stream);
    ASSERT_TRUE(event.has_value()) << "event " << i;
    events.push_back(*event);
  }
  EXPECT_EQ(StepsOf(events, backup), kAllSteps);
  EXPECT_EQ(events.back().type, OpEvent::Type::kCommitted);  // After steps.
  EXPECT_EQ(events.back().op, backup);
  EXPECT_EQ(events.back().node, node);
  // The session forgot the finished backup.
  EXPECT_EQ(stream->Rollback(backup).code(),
            absl::StatusCode::kInvalidArgument);
  stream->EndOfInput(/*broken=*/false);
  EXPECT_FALSE(NextOrFail(*stream).has_value());
  EXPECT_FALSE(NextOrFail(*stream).has_value());  // For good.
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tier, NodeTier::kBoth);  // Committed: host-backed.
  stream.reset();
  CloseAndExpectNothingHeld();
}

// Half-close with a backup whose layers are all stored and whose node is
// attached: only its copies are missing, so it is kept, and NextEvent ends
// only after its commit was delivered.
TEST_F(BackupStreamTest, HalfCloseKeepsABackupThatOnlyAwaitsCopies) {
  HoldCopies();
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request r = Compute(0);
  auto ids = stream->Prepare({r.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t backup = ids->front();
  const NodeId node = InsertWithBackup(r, backup);
  StoreSteps(*stream, backup, 0, Steps());
  absl::StatusOr<bool> awaits = engine_->BackupAwaitsClient(backup);
  ASSERT_TRUE(awaits.ok()) << awaits.status();
  ASSERT_FALSE(*awaits);
  stream->EndOfInput(/*broken=*/false);
  // The writer waits (blocked) for the outcome; the copies complete later.
  auto writer = std::async(std::launch::async, [&] { return Drain(*stream); });
  ReleaseCopies();
  ASSERT_EQ(writer.wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  std::vector<OpEvent> events = writer.get();
  EXPECT_EQ(StepsOf(events, backup), kAllSteps);
  EXPECT_THAT(Outcomes(events),
              ElementsAre(Pair(backup, OpEvent::Type::kCommitted)));
  EXPECT_EQ(events.back().type, OpEvent::Type::kCommitted);
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  EXPECT_EQ(engine_->Stats().backups_rolled_back, 0);
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->pending_backup);
  EXPECT_EQ(info->tier, NodeTier::kBoth);
  EXPECT_EQ(HostUsed(), 2);  // The node's two pages, on their owners.
  stream.reset();
  CloseAndExpectNothingHeld();
}

// Half-close rolls back the backups that still need the client -- a layer
// not stored, or no node attached -- and keeps the one that only awaits
// copies; every outcome is delivered before NextEvent ends.
TEST_F(BackupStreamTest, HalfCloseRollsBackBackupsThatStillNeedTheClient) {
  HoldCopies();
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request ready = Compute(0);
  const Request missing_layer = Compute(100);
  const Request unattached = Compute(200);
  auto ids =
      stream->Prepare({ready.spec(), missing_layer.spec(), unattached.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_THAT(*ids, ::testing::SizeIs(3));
  const uint64_t ready_id = (*ids)[0];
  const uint64_t missing_id = (*ids)[1];
  const uint64_t unattached_id = (*ids)[2];
  const NodeId ready_node = InsertWithBackup(ready, ready_id);
  const NodeId missing_node = InsertWithBackup(missing_layer, missing_id);
  StoreSteps(*stream, ready_id, 0, Steps());
  StoreSteps(*stream, missing_id, 0, Steps() - 1);  // The last one is not.
  StoreSteps(*stream, unattached_id, 0, Steps());
  stream->EndOfInput(/*broken=*/false);
  auto writer = std::async(std::launch::async, [&] { return Drain(*stream); });
  ReleaseCopies();
  ASSERT_EQ(writer.wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  std::vector<OpEvent> events = writer.get();
  EXPECT_THAT(
      Outcomes(events),
      UnorderedElementsAre(Pair(ready_id, OpEvent::Type::kCommitted),
                           Pair(missing_id, OpEvent::Type::kRolledBack),
                           Pair(unattached_id, OpEvent::Type::kRolledBack)));
  EXPECT_EQ(StepsOf(events, ready_id), kAllSteps);
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  EXPECT_EQ(engine_->Stats().backups_rolled_back, 2);
  // Only the kept backup's pages are on host; the rolled-back node stays
  // device-only with no backup pending.
  EXPECT_EQ(HostUsed(), 2);
  auto missing = engine_->Inspect(missing_node);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->pending_backup);
  EXPECT_EQ(missing->tier, NodeTier::kDevice);
  auto kept = engine_->Inspect(ready_node);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->tier, NodeTier::kBoth);
  stream.reset();
  CloseAndExpectNothingHeld();
}

// A broken stream (cancelled, bad message) rolls back every open backup,
// even one that only awaits its copies.
TEST_F(BackupStreamTest, BrokenStreamRollsBackEverything) {
  HoldCopies();
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request ready = Compute(0);
  const Request missing_layer = Compute(100);
  auto ids = stream->Prepare({ready.spec(), missing_layer.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t ready_id = (*ids)[0];
  const uint64_t missing_id = (*ids)[1];
  const NodeId ready_node = InsertWithBackup(ready, ready_id);
  InsertWithBackup(missing_layer, missing_id);
  StoreSteps(*stream, ready_id, 0, Steps());
  StoreSteps(*stream, missing_id, 0, 1);
  stream->EndOfInput(/*broken=*/true);
  // The outcomes do not wait for the copies.
  std::vector<OpEvent> events = Drain(*stream);
  EXPECT_THAT(
      Outcomes(events),
      UnorderedElementsAre(Pair(ready_id, OpEvent::Type::kRolledBack),
                           Pair(missing_id, OpEvent::Type::kRolledBack)));
  ReleaseCopies();
  EXPECT_EQ(engine_->Stats().backups_committed, 0);
  EXPECT_EQ(engine_->Stats().backups_rolled_back, 2);
  EXPECT_EQ(HostUsed(), 0);  // Reservations freed once the copies ended.
  auto node = engine_->Inspect(ready_node);
  ASSERT_TRUE(node.ok());
  EXPECT_FALSE(node->pending_backup);
  EXPECT_EQ(node->tier, NodeTier::kDevice);
  EXPECT_EQ(stream->Rollback(ready_id).code(),
            absl::StatusCode::kInvalidArgument);  // Nothing left to roll back.
  stream.reset();
  CloseAndExpectNothingHeld();
}

// More events than max_backlog wait: on_overflow runs once, NextEvent ends
// (without the outcome), and a broken EndOfInput still rolls back.
TEST_F(BackupStreamTest, OverflowRunsOnOverflowOnceAndEndsNextEvent) {
  std::unique_ptr<BackupStream> stream = OpenStream(/*max_backlog=*/2);
  const Request r = Compute(0);
  const Request other = Compute(100);
  auto ids = stream->Prepare({r.spec(), other.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t backup = (*ids)[0];
  // 2 x 4 step events for a backlog of 2, nobody reading.
  StoreSteps(*stream, backup, 0, Steps());
  StoreSteps(*stream, (*ids)[1], 0, Steps());
  engine_->WaitForTransfers();
  EXPECT_EQ(overflows_.load(), 1);
  EXPECT_TRUE(stream->overflowed());
  EXPECT_FALSE(NextOrFail(*stream).has_value());
  // What the RPC does once on_overflow cancelled it.
  stream->EndOfInput(/*broken=*/true);
  engine_->WaitForTransfers();
  EXPECT_FALSE(NextOrFail(*stream).has_value());
  EXPECT_EQ(overflows_.load(), 1);  // Later events are dropped silently.
  EXPECT_EQ(engine_->Stats().backups_rolled_back, 2);
  EXPECT_EQ(HostUsed(), 0);
  stream.reset();
  EXPECT_EQ(hub_.claimed(), 0u);
  // The slot came back: the session may open its full allowance again.
  std::unique_ptr<BackupStream> a = OpenStream();
  std::unique_ptr<BackupStream> b = OpenStream();
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
  a.reset();
  b.reset();
  CloseAndExpectNothingHeld();
}

// The session closes under an open stream (its lease lapsed): its backups
// are rolled back and the stream still delivers their outcomes and ends.
TEST_F(BackupStreamTest, SessionExpiryRollsBackAndTheStreamStillEnds) {
  HoldCopies();
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request r = Compute(0);
  auto ids = stream->Prepare({r.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t backup = ids->front();
  StoreSteps(*stream, backup, 0, 1);
  clock_.Advance(absl::Minutes(2));
  ASSERT_EQ(sessions_->ExpireLapsed(), 1);
  std::optional<OpEvent> outcome;
  while (std::optional<OpEvent> event = NextOrFail(*stream)) {
    if (event->type != OpEvent::Type::kBackupStep) {
      outcome = event;
      break;
    }
  }
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->type, OpEvent::Type::kRolledBack);
  EXPECT_EQ(outcome->op, backup);
  stream->EndOfInput(/*broken=*/false);
  EXPECT_FALSE(NextOrFail(*stream).has_value());
  stream.reset();
  ReleaseCopies();
  EXPECT_EQ(engine_->AllRequestPages(), 0);
  EXPECT_EQ(HostUsed(), 0);
  const absl::Status invariants = engine_->CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
}

// A backup whose copy fails is rolled back by the engine, which keeps its
// (empty) record until the client is done with it (engine_failures.cc). Once
// the stream delivered rolled_back, its client is done: nothing of the
// backup may stay behind, not even after the session closed.
// (Reproduced a bug: the session forgot the backup at rolled_back, so
// nobody could release the engine's record.)
TEST_F(BackupStreamTest, FailedCopyLeavesNoBackupRecordBehind) {
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request r = Compute(0);
  auto ids = stream->Prepare({r.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t backup = ids->front();
  faults_->FailAt({.op_id = backup,
                   .direction = TransferDirection::kDeviceToHost,
                   .rank = 0,
                   .step = 0});
  StoreSteps(*stream, backup, 0, 1);
  engine_->WaitForTransfers();
  std::optional<OpEvent> outcome;
  while (std::optional<OpEvent> event = NextOrFail(*stream)) {
    if (event->type != OpEvent::Type::kBackupStep) {
      outcome = event;
      break;
    }
  }
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->type, OpEvent::Type::kRolledBack);
  EXPECT_EQ(engine_->Stats().backups_failed, 1);
  stream->EndOfInput(/*broken=*/false);
  EXPECT_FALSE(NextOrFail(*stream).has_value());
  stream.reset();
  CloseAndExpectNothingHeld();
  EXPECT_EQ(engine_->BackupAwaitsClient(backup).status().code(),
            absl::StatusCode::kNotFound)
      << "the failed backup's record outlived its stream and its session";
}

// The client of a backup whose copy failed may not have read rolled_back yet
// when it goes on: the engine answers such a client (engine_failures.cc:
// LayerStored skips the backup, AttachBackup is ABORTED, so the request is
// cached without it). Through the stream it must get the same answers.
// (Reproduced a bug: once rolled_back was delivered, layer_stored and the
// insert naming the backup were refused as foreign.)
TEST_F(BackupStreamTest, ClientThatMissedAFailureGetsDefinedAnswers) {
  std::unique_ptr<BackupStream> stream = OpenStream();
  const Request r = Compute(0);
  auto ids = stream->Prepare({r.spec()});
  ASSERT_TRUE(ids.ok()) << ids.status();
  const uint64_t backup = ids->front();
  faults_->FailAt({.op_id = backup,
                   .direction = TransferDirection::kDeviceToHost,
                   .rank = 0,
                   .step = 0});
  StoreSteps(*stream, backup, 0, 1);
  engine_->WaitForTransfers();
  // The stream's writer delivers the outcome (the client reads it later).
  std::optional<OpEvent> outcome;
  while (std::optional<OpEvent> event = NextOrFail(*stream)) {
    if (event->type != OpEvent::Type::kBackupStep) {
      outcome = event;
      break;
    }
  }
  ASSERT_TRUE(outcome.has_value());
  ASSERT_EQ(outcome->type, OpEvent::Type::kRolledBack);
  EXPECT_TRUE(stream->LayerStored({backup}, 1, {}).ok());
  auto inserted = sessions_->Insert(
      id_, {SessionInsertItem{
               .tokens = r.tokens, .pages = r.pages, .backup_id = backup}});
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  EXPECT_FALSE(inserted->front().backup_attached);
  EXPECT_EQ(inserted->front().insert.cached_len, kTokens);
  stream->EndOfInput(/*broken=*/false);
  EXPECT_FALSE(NextOrFail(*stream).has_value());
  stream.reset();
  CloseAndExpectNothingHeld();
}

}  // namespace
}  // namespace hicache
