// LoadStream: one LoadBack stream's loads over a real engine (CPU backend,
// C = 2, P = 4, preset "tiny": 2 steps, so a load has 4 per-rank layer
// events), a SessionManager and an EventHub set as the engine's listener.
// Loads are made real by evicting a committed backup's node to host first;
// copies are held back where a test needs a load in flight
// (FaultyTransferEngine::HoldWhen), never waited for with sleeps.
#include "daemon/engine/load_stream.h"

#include <atomic>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/core/clock.h"
#include "daemon/engine/backup_stream.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/engine/stream_context.h"
#include "daemon/transfer/faulty_transfer_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/kv_pattern.h"

namespace hicache {
namespace {

using testing::VerifyKv;
using testing::WriteKv;

constexpr int64_t kP = 4;
constexpr int64_t kTokens = 8;  // Two pages per request.

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

class LoadStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.page_size = kP;
    options.cp_size = 2;
    options.kv_preset = "tiny";
    options.device_pages_per_rank = 32;
    options.host_pages_per_rank = 64;
    // No backup starts on its own (a LoadBack's match would start
    // write-through backups otherwise).
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

  std::unique_ptr<LoadStream> OpenStream(size_t max_backlog = 1024) {
    auto stream = LoadStream::Open(Context(max_backlog), id_);
    EXPECT_TRUE(stream.ok()) << stream.status();
    return stream.ok() ? *std::move(stream) : nullptr;
  }

  // Caches `tokens` held in the session's `pages` on device, with `backup`
  // attached if not 0; returns the node.
  NodeId Insert(const std::vector<int32_t>& tokens,
                const std::vector<LogicalPage>& pages, uint64_t backup = 0) {
    auto inserted = sessions_->Insert(
        id_, {SessionInsertItem{
                 .tokens = tokens, .pages = pages, .backup_id = backup}});
    EXPECT_TRUE(inserted.ok()) << inserted.status();
    if (!inserted.ok()) return kNoNode;
    EXPECT_EQ(inserted->front().insert.cached_len,
              static_cast<int64_t>(tokens.size()));
    EXPECT_EQ(inserted->front().backup_attached, backup != 0);
    return inserted->front().insert.node;
  }

  std::vector<LogicalPage> Allocate() {
    auto pages = sessions_->Allocate(id_, {AllocationItem{.num_pages = 2}});
    EXPECT_TRUE(pages.ok()) << pages.status();
    return pages.ok() ? pages->front() : std::vector<LogicalPage>{};
  }

  // Caches `tokens` with a committed backup, then evicts the node's device
  // pages: the node is host-only, a real load. Returns the node.
  NodeId CacheOnHostOnly(const std::vector<int32_t>& tokens) {
    std::vector<LogicalPage> pages = Allocate();
    WriteKv(*engine_, tokens, pages, 0);
    auto backup = sessions_->PrepareBackups(
        id_, {BackupSpec{pages, static_cast<int64_t>(tokens.size())}});
    EXPECT_TRUE(backup.ok()) << backup.status();
    if (!backup.ok()) return kNoNode;
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      EXPECT_TRUE(sessions_->LayerStored(id_, *backup, s).ok());
    }
    const NodeId node = Insert(tokens, pages, backup->front());
    engine_->WaitForTransfers();
    EXPECT_EQ(engine_->Stats().backups_committed, 1);
    auto evicted = engine_->EvictPages({100, 100}, {});
    EXPECT_TRUE(evicted.ok()) << evicted.status();
    auto info = engine_->Inspect(node);
    EXPECT_TRUE(info.ok() && info->tier == NodeTier::kHost);
    return node;
  }

  // Host-to-device completions wait until ReleaseCopies: the load stays in
  // flight.
  void HoldLoads() {
    faults_->HoldWhen([](const TransferSite& site) {
      return site.direction == TransferDirection::kHostToDevice;
    });
  }
  void ReleaseCopies() {
    faults_->HoldWhen(nullptr);
    faults_->Drain();
    engine_->WaitForTransfers();
  }

  static absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

  // Starts a load of `tokens` on `stream` and waits until its copies are
  // done (its done not read yet): *op_id is the load's op.
  void StartFinishedLoad(LoadStream* stream, const std::vector<int32_t>& tokens,
                         uint64_t* op_id) {
    auto load = stream->Start(0, tokens, {});
    ASSERT_TRUE(load.ok()) << load.status();
    ASSERT_NE(load->op_id, 0u);
    engine_->WaitForTransfers();
    absl::StatusOr<bool> done = engine_->LoadDone(load->op_id);
    ASSERT_TRUE(done.ok() && *done);
    *op_id = load->op_id;
  }

  void ExpectNothingHeld() {
    engine_->WaitForTransfers();
    EXPECT_EQ(engine_->AllRequestPages(), 0);
    EXPECT_EQ(sessions_->totals().locks, 0);
    EXPECT_EQ(engine_->DeviceAllocatedPages(), engine_->TreeDevicePages());
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

TEST_F(LoadStreamTest, StreamLimitIsSharedWithBackupStreamsAndComesBack) {
  EXPECT_EQ(LoadStream::Open(Context(), "no-such-session").status().code(),
            absl::StatusCode::kNotFound);
  std::unique_ptr<LoadStream> load = OpenStream();
  auto backups = BackupStream::Open(Context(), id_);
  ASSERT_NE(load, nullptr);
  ASSERT_TRUE(backups.ok()) << backups.status();
  EXPECT_EQ(LoadStream::Open(Context(), id_).status().code(),
            absl::StatusCode::kResourceExhausted);
  load.reset();
  std::unique_ptr<LoadStream> again = OpenStream();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(LoadStream::Open(Context(), id_).status().code(),
            absl::StatusCode::kResourceExhausted);
  again.reset();
  backups->reset();
  std::unique_ptr<LoadStream> a = OpenStream();
  std::unique_ptr<LoadStream> b = OpenStream();
  EXPECT_NE(a, nullptr);
  EXPECT_NE(b, nullptr);
}

TEST_F(LoadStreamTest, NothingToLoadIsOverAtOnce) {
  std::unique_ptr<LoadStream> stream = OpenStream();
  // A miss: nothing locked, nothing pending.
  auto miss = stream->Start(0, Seq(0, kTokens), {});
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->op_id, 0u);
  EXPECT_EQ(miss->node, kNoNode);
  EXPECT_EQ(miss->lock_handle, 0u);
  EXPECT_FALSE(stream->pending());
  EXPECT_FALSE(stream->Next(absl::InfinitePast()).has_value());
  EXPECT_EQ(sessions_->totals().locks, 0);
  // A device hit: locked for the session at once, under its handle.
  const NodeId node = Insert(Seq(100, kTokens), Allocate());
  auto hit = stream->Start(1, Seq(100, kTokens), {});
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->op_id, 0u);
  EXPECT_EQ(hit->device_len, kTokens);
  EXPECT_EQ(hit->node, node);
  EXPECT_NE(hit->lock_handle, 0u);
  EXPECT_FALSE(stream->pending());
  EXPECT_FALSE(stream->Next(absl::InfinitePast()).has_value());
  EXPECT_EQ(sessions_->totals().locks, 1);
  EXPECT_EQ(hub_.claimed(), 0u);
  ASSERT_TRUE(sessions_->UnlockHandles(id_, {hit->lock_handle}).ok());
  stream.reset();
  ExpectNothingHeld();
}

TEST_F(LoadStreamTest, LoadsLayerByLayerThenHandsItsLockToTheSession) {
  const std::vector<int32_t> tokens = Seq(0, kTokens);
  const NodeId node = CacheOnHostOnly(tokens);
  std::unique_ptr<LoadStream> stream = OpenStream();
  auto load = stream->Start(/*item=*/3, tokens, {});
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_NE(load->op_id, 0u);
  EXPECT_EQ(load->loaded_len, kTokens);
  EXPECT_EQ(load->num_steps, engine_->geometry().NumSteps());
  EXPECT_EQ(load->node, node);
  EXPECT_EQ(load->lock_handle, 0u);  // Only once the load is done.
  EXPECT_TRUE(stream->pending());
  std::multiset<std::pair<Rank, uint32_t>> layers;
  std::optional<LoadStream::Event> done;
  while (std::optional<LoadStream::Event> event = stream->Next(Soon())) {
    EXPECT_EQ(event->item, 3u);
    EXPECT_EQ(event->load, load->op_id);
    if (event->kind == LoadStream::Event::Kind::kDone) {
      done = event;
      break;
    }
    layers.insert({event->rank, event->step});
  }
  ASSERT_TRUE(done.has_value()) << "no done before the deadline";
  EXPECT_EQ(layers, kAllSteps);  // Every layer of every rank, before done.
  EXPECT_TRUE(done->ok);
  ASSERT_NE(done->lock_handle, 0u);
  EXPECT_FALSE(stream->pending());
  EXPECT_FALSE(stream->Next(absl::InfinitePast()).has_value());
  EXPECT_EQ(hub_.claimed(), 0u);
  // The bytes came back, and the node is locked once: the session's lock
  // (the load's own lock was released).
  EXPECT_TRUE(VerifyKv(*engine_, tokens, load->pages, kTokens).ok());
  EXPECT_EQ(sessions_->totals().locks, 1);
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tier, NodeTier::kBoth);
  EXPECT_EQ(info->lock_ref, 1);
  ASSERT_TRUE(sessions_->UnlockHandles(id_, {done->lock_handle}).ok());
  info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->lock_ref, 0);
  EXPECT_EQ(engine_->Stats().loads_done, 1);
  stream.reset();
  ExpectNothingHeld();
}

// The client goes away mid-load: the load is abandoned, and once its copies
// end nothing of it is left (no pages, locks or host refs), so the node
// loads again as before.
TEST_F(LoadStreamTest, DestructionMidLoadAbandonsItAndLeaksNothing) {
  const std::vector<int32_t> tokens = Seq(0, kTokens);
  const NodeId node = CacheOnHostOnly(tokens);
  HoldLoads();
  std::unique_ptr<LoadStream> stream = OpenStream();
  auto load = stream->Start(0, tokens, {});
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_NE(load->op_id, 0u);
  absl::StatusOr<bool> done = engine_->LoadDone(load->op_id);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_FALSE(*done);  // In flight.
  EXPECT_FALSE(stream->Next(absl::InfinitePast()).has_value());
  stream.reset();
  EXPECT_EQ(hub_.claimed(), 0u);
  ReleaseCopies();
  ExpectNothingHeld();
  EXPECT_EQ(engine_->Stats().loads_done, 0);
  EXPECT_EQ(engine_->LoadDone(load->op_id).status().code(),
            absl::StatusCode::kNotFound);
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tier, NodeTier::kHost);
  EXPECT_EQ(info->host_ref, 0);
  EXPECT_EQ(info->lock_ref, 0);
  // Nothing stuck: a new stream (the old one's slot came back) loads it.
  std::unique_ptr<LoadStream> a = OpenStream();
  std::unique_ptr<LoadStream> b = OpenStream();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto reload = a->Start(0, tokens, {});
  ASSERT_TRUE(reload.ok()) << reload.status();
  ASSERT_NE(reload->op_id, 0u);
  std::optional<LoadStream::Event> event;
  do {
    event = a->Next(Soon());
  } while (event.has_value() && event->kind != LoadStream::Event::Kind::kDone);
  ASSERT_TRUE(event.has_value());
  EXPECT_TRUE(event->ok);
  ASSERT_TRUE(sessions_->UnlockHandles(id_, {event->lock_handle}).ok());
  a.reset();
  b.reset();
  ExpectNothingHeld();
}

// The load ended but the client never read its done: destruction releases
// the load's lock (nothing is handed to the session), so the node is
// evictable again.
TEST_F(LoadStreamTest, DestructionAfterAnUnreadDoneReleasesTheLoadsLock) {
  const std::vector<int32_t> tokens = Seq(0, kTokens);
  const NodeId node = CacheOnHostOnly(tokens);
  std::unique_ptr<LoadStream> stream = OpenStream();
  uint64_t op_id = 0;
  ASSERT_NO_FATAL_FAILURE(StartFinishedLoad(stream.get(), tokens, &op_id));
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->lock_ref, 1);  // The load's own lock.
  stream.reset();
  info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->lock_ref, 0);
  ExpectNothingHeld();
  auto evicted = engine_->EvictPages({100, 100}, {});
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->first, 2);
}

// Reproduction (found by the ASan run of hicache_session_test): the load
// ended, and the client's FinishLoad released it before the stream read its
// done. The stream used to lock the node for the session anyway and report
// done(ok) with a lock handle, after FinishLoad had said "released". Now the
// client's FinishLoad wins: done(ok=false), no handle, nothing held.
TEST_F(LoadStreamTest, FinishLoadBeforeTheDoneIsReadHandsNothingOver) {
  const std::vector<int32_t> tokens = Seq(0, kTokens);
  const NodeId node = CacheOnHostOnly(tokens);
  std::unique_ptr<LoadStream> stream = OpenStream();
  uint64_t op_id = 0;
  ASSERT_NO_FATAL_FAILURE(StartFinishedLoad(stream.get(), tokens, &op_id));
  ASSERT_TRUE(sessions_->FinishLoad(id_, op_id).ok());
  std::optional<LoadStream::Event> done;
  while (std::optional<LoadStream::Event> event = stream->Next(Soon())) {
    if (event->kind == LoadStream::Event::Kind::kDone) {
      done = event;
      break;
    }
  }
  ASSERT_TRUE(done.has_value());
  EXPECT_FALSE(done->ok);
  EXPECT_EQ(done->lock_handle, 0u);
  EXPECT_EQ(sessions_->totals().locks, 0);
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->lock_ref, 0);
  stream.reset();
  ExpectNothingHeld();
}

// More events than max_backlog wait: on_overflow runs once, Next ends, and
// destruction still releases everything.
TEST_F(LoadStreamTest, OverflowRunsOnOverflowOnceAndEndsNext) {
  const std::vector<int32_t> tokens = Seq(0, kTokens);
  const NodeId node = CacheOnHostOnly(tokens);
  std::unique_ptr<LoadStream> stream = OpenStream(/*max_backlog=*/1);
  auto load = stream->Start(0, tokens, {});
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_NE(load->op_id, 0u);
  engine_->WaitForTransfers();  // 4 layers and a done for a backlog of 1.
  EXPECT_EQ(overflows_.load(), 1);
  EXPECT_TRUE(stream->overflowed());
  EXPECT_FALSE(stream->Next(Soon()).has_value());  // At once, not at Soon().
  EXPECT_TRUE(stream->pending());                  // Its done was dropped.
  stream.reset();
  EXPECT_EQ(overflows_.load(), 1);
  EXPECT_EQ(hub_.claimed(), 0u);
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->lock_ref, 0);
  ExpectNothingHeld();
}

// The session ends mid-load (lease lapsed): the load ends as a miss, which
// the stream still reports, holding no lock for anyone.
TEST_F(LoadStreamTest, SessionExpiryMidLoadEndsItAsAMiss) {
  const std::vector<int32_t> tokens = Seq(0, kTokens);
  const NodeId node = CacheOnHostOnly(tokens);
  HoldLoads();
  std::unique_ptr<LoadStream> stream = OpenStream();
  auto load = stream->Start(5, tokens, {});
  ASSERT_TRUE(load.ok()) << load.status();
  ASSERT_NE(load->op_id, 0u);
  clock_.Advance(absl::Minutes(2));
  ASSERT_EQ(sessions_->ExpireLapsed(), 1);
  ReleaseCopies();
  std::optional<LoadStream::Event> event;
  do {
    event = stream->Next(Soon());
  } while (event.has_value() && event->kind != LoadStream::Event::Kind::kDone);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->item, 5u);
  EXPECT_FALSE(event->ok);
  EXPECT_EQ(event->lock_handle, 0u);
  EXPECT_FALSE(stream->pending());
  stream.reset();
  engine_->WaitForTransfers();
  EXPECT_EQ(engine_->AllRequestPages(), 0);
  EXPECT_EQ(engine_->DeviceAllocatedPages(), engine_->TreeDevicePages());
  const absl::Status invariants = engine_->CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
  auto info = engine_->Inspect(node);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->tier, NodeTier::kHost);
  EXPECT_EQ(info->lock_ref, 0);
  EXPECT_EQ(info->host_ref, 0);
}

}  // namespace
}  // namespace hicache
