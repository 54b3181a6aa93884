// The worker side of a CP group with real processes (issue 13,
// docs/cp-groups.md "Worker events and acks across the link"): worker
// sessions (ROLE_WORKER, rank r, the scheduler's namespace) opened on the
// daemon that holds rank r -- a follower's unix socket for its ranks -- while
// this test is the scheduler on the leader.
//
// - Events: a worker of every rank Subscribes on its own daemon and
//   receives, for a backup the scheduler prepared on the leader, every
//   backup_step of its rank then backup_ended{committed}; for a load the
//   scheduler started on the leader, every layer_loaded of its rank then
//   load_ended{ok}; for a backup the scheduler rolls back, backup_ended
//   {committed: false}.
// - Acks: the scheduler prepares but does not ack; each rank's worker sends
//   layer_stored for its rank on a BackupSession stream of its own daemon
//   (a follower relays it to the leader). The backup commits only once every
//   rank's worker acked the last step (not while one follower worker still
//   holds its last ack back), and what kv_agent workers wrote loads back
//   byte-exact on every rank.
// - Refusals with nothing changed: a follower's worker session for a rank
//   its daemon does not hold (refused at OpenSession), an ack of another
//   namespace's op, a fence on a follower, and an ack after the leader was
//   SIGKILLed (UNAVAILABLE; the follower then exits non-zero).
//
// Both splits: C = 4 as 2 + 2, C = 2 as 1 + 1.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/hicache_session.h"
#include "gtest/gtest.h"
#include "tests/integration/cp_group_fixture.h"
#include "tests/integration/cp_group_test_base.h"

namespace hicache::cp_group_testing {
namespace {

// How long a worker waits for an event or a reply before the test fails
// (generous: a loaded 2-core CI box under a sanitizer).
constexpr absl::Duration kEventTimeout = absl::Seconds(30);

// Runs `on_timeout` (from its own thread) unless destroyed within `timeout`:
// bounds a blocking read that has no deadline of its own.
class Watchdog {
 public:
  Watchdog(absl::Duration timeout, std::function<void()> on_timeout)
      : thread_([this, timeout, on_timeout = std::move(on_timeout)] {
          if (done_.get_future().wait_for(absl::ToChronoMilliseconds(
                  timeout)) == std::future_status::timeout) {
            fired_ = true;
            on_timeout();
          }
        }) {}
  ~Watchdog() {
    done_.set_value();
    thread_.join();
  }
  bool fired() const { return fired_; }

 private:
  std::promise<void> done_;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// One worker process's side, held in the test: a worker session of `rank`
// on the daemon that holds it (or on `member` when given).
struct Worker {
  uint32_t rank = 0;
  size_t member = 0;
  std::unique_ptr<client::Session> session;
  std::unique_ptr<client::WorkerEvents> events;
  std::unique_ptr<client::BackupStream> backups;
};

class CpGroupWorkerTest : public CpGroupTest {
 protected:
  ~CpGroupWorkerTest() override {
    for (Worker& w : workers_) {
      if (w.backups != nullptr) w.backups->Cancel();
      if (w.events != nullptr) w.events->Cancel();
    }
    workers_.clear();
  }

  // A worker session of `rank` on `member`'s socket (the rank's own daemon
  // when `member` is npos), in namespace `ns` ("" is the scheduler's).
  absl::StatusOr<Worker> OpenWorker(uint32_t rank, size_t member = kOwnDaemon,
                                    const std::string& ns = "") {
    Worker w;
    w.rank = rank;
    w.member = member == kOwnDaemon ? group_->MemberOfRank(rank) : member;
    auto session =
        client::Session::Open(group_->stub(w.member), absl::StrCat("worker", rank),
                              v1::ROLE_WORKER, rank, ns);
    if (!session.ok()) return session.status();
    w.session = *std::move(session);
    return w;
  }

  // Opens a subscribed worker with a BackupSession stream for every rank.
  void OpenEveryWorker() {
    for (uint32_t r = 0; r < cp(); ++r) {
      auto w = OpenWorker(r);
      ASSERT_TRUE(w.ok()) << "rank " << r << ": " << w.status()
                          << group_->DescribeLogs(10);
      auto events = w->session->Subscribe();
      ASSERT_TRUE(events.ok()) << "rank " << r << ": " << events.status();
      w->events = *std::move(events);
      auto backups = w->session->OpenBackupStream();
      ASSERT_TRUE(backups.ok()) << "rank " << r << ": " << backups.status();
      w->backups = *std::move(backups);
      workers_.push_back(*std::move(w));
    }
  }

  // Reads `w`'s events until `done(event)`; every event read is appended
  // to *seen. False if the stream ended or nothing came within the bound.
  bool ReadEventsUntil(Worker& w,
                       const std::function<bool(const v1::WorkerEvent&)>& done,
                       std::vector<v1::WorkerEvent>* seen) {
    Watchdog watchdog(kEventTimeout, [&w] { w.events->Cancel(); });
    v1::WorkerEvent event;
    while (w.events->Next(&event)) {
      seen->push_back(event);
      if (done(event)) return true;
    }
    return false;
  }

  // Worker `w` saw backup_steps of its rank only for `backup` -- every
  // step, or with `max_steps` at most steps [0, max_steps) -- then its
  // backup_ended with `committed`.
  void ExpectBackupEvents(Worker& w, uint64_t backup, bool committed,
                          std::optional<uint32_t> max_steps = std::nullopt) {
    std::vector<v1::WorkerEvent> seen;
    ASSERT_TRUE(ReadEventsUntil(
        w,
        [backup](const v1::WorkerEvent& e) {
          return e.has_backup_ended() && e.backup_ended().backup_id() == backup;
        },
        &seen))
        << "rank " << w.rank << " on " << group_->member_name(w.member)
        << ": no backup_ended of " << backup << " (" << seen.size()
        << " events)" << group_->DescribeLogs(10);
    std::set<uint32_t> steps;
    for (const v1::WorkerEvent& e : seen) {
      if (!e.has_backup_step() || e.backup_step().backup_id() != backup) {
        continue;
      }
      EXPECT_EQ(e.rank(), w.rank) << e.ShortDebugString();
      EXPECT_TRUE(steps.insert(e.backup_step().step()).second)
          << "repeated: " << e.ShortDebugString();
    }
    if (max_steps.has_value()) {
      if (!steps.empty()) {
        EXPECT_LT(*steps.rbegin(), *max_steps) << "rank " << w.rank;
      }
    } else {
      EXPECT_EQ(steps.size(), layout_.num_steps()) << "rank " << w.rank;
      if (!steps.empty()) {
        EXPECT_EQ(*steps.rbegin(), layout_.num_steps() - 1);
      }
    }
    EXPECT_EQ(seen.back().backup_ended().committed(), committed);
  }

  // Worker `w` saw every layer_loaded of its rank for `load`, then its
  // load_ended with `ok`.
  void ExpectLoadEvents(Worker& w, uint64_t load, bool ok) {
    std::vector<v1::WorkerEvent> seen;
    ASSERT_TRUE(ReadEventsUntil(
        w,
        [load](const v1::WorkerEvent& e) {
          return e.has_load_ended() && e.load_ended().load_id() == load;
        },
        &seen))
        << "rank " << w.rank << " on " << group_->member_name(w.member)
        << ": no load_ended of " << load << " (" << seen.size() << " events)"
        << group_->DescribeLogs(10);
    std::set<uint32_t> steps;
    for (const v1::WorkerEvent& e : seen) {
      if (!e.has_layer_loaded() || e.layer_loaded().load_id() != load) continue;
      EXPECT_EQ(e.rank(), w.rank) << e.ShortDebugString();
      EXPECT_TRUE(steps.insert(e.layer_loaded().step()).second)
          << "repeated: " << e.ShortDebugString();
    }
    EXPECT_EQ(steps.size(), layout_.num_steps()) << "rank " << w.rank;
    EXPECT_EQ(seen.back().load_ended().ok(), ok);
  }

  // Sends one layer_stored on `w`'s stream and reads its reply: the
  // `error` the daemon answers a refused ack with. Nothing but an error is
  // expected on a worker's stream here.
  absl::StatusOr<v1::BackupServerMessage::Error> AckExpectingError(
      Worker& w, uint64_t backup, uint32_t step,
      const std::vector<v1::RankFence>& fences = {}) {
    if (absl::Status s = w.backups->LayerStored({backup}, step, fences);
        !s.ok()) {
      return s;
    }
    Watchdog watchdog(kEventTimeout, [&w] { w.backups->Cancel(); });
    while (true) {
      absl::StatusOr<v1::BackupServerMessage> message = w.backups->Next();
      if (!message.ok()) return message.status();
      if (message->has_error()) return message->error();
    }
  }

  // Allocates `pages` zigzag pages, has kv_agent workers write them, and
  // prepares their backup on the leader; the scheduler acks nothing.
  Key WriteAndPrepare(int32_t base, int pages, uint32_t seed,
                      uint64_t* backup) {
    Key key{Tokens(base, static_cast<size_t>(pages) * page_size()), {}, seed};
    key.pages = Allocate(pages);
    EXPECT_EQ(key.pages.size(), static_cast<size_t>(pages));
    RunWorkers("write", key.pages, seed);
    *backup = Prepare(key);
    EXPECT_NE(*backup, 0u) << "backup skipped" << group_->DescribeLogs(10);
    return key;
  }

  // WaitCommitted on the scheduler's stream, bounded: the stream is
  // cancelled (and the wait fails) if `backup` does not end in time.
  absl::StatusOr<uint64_t> WaitCommittedBounded(uint64_t backup) {
    Watchdog watchdog(kEventTimeout, [this] { backups_->Cancel(); });
    return backups_->WaitCommitted(backup);
  }

  static constexpr size_t kOwnDaemon = static_cast<size_t>(-1);
  std::vector<Worker> workers_;  // workers_[r]: rank r's, once opened.
};

class CpGroupWorkerSplitTest : public CpGroupWorkerTest,
                               public ::testing::WithParamInterface<GroupSpec> {
};

// --- Leader -> follower: worker events ----------------------------------------

TEST_P(CpGroupWorkerSplitTest, EveryWorkerGetsItsRanksEventsOnItsOwnDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(GetParam()));
  ASSERT_NO_FATAL_FAILURE(OpenEveryWorker());

  // A backup the scheduler prepares and acks on the leader.
  uint64_t backup = 0;
  const Key key = WriteAndPrepare(1000, static_cast<int>(2 * cp() + 1), 5,
                                  &backup);
  ASSERT_NE(backup, 0u);
  ASSERT_NO_FATAL_FAILURE(StoreLayers(backup, 0, layout_.num_steps()));
  Insert(key, backup);
  auto committed = WaitCommittedBounded(backup);
  ASSERT_TRUE(committed.ok()) << committed.status() << group_->DescribeLogs();
  for (Worker& w : workers_) {
    ASSERT_NO_FATAL_FAILURE(ExpectBackupEvents(w, backup, /*committed=*/true));
  }

  // A backup the scheduler rolls back after one layer: every worker hears
  // it ended, not committed (at most step 0 of its rank before that).
  {
    uint64_t rolled = 0;
    const Key doomed = WriteAndPrepare(20000, static_cast<int>(cp()), 6,
                                       &rolled);
    ASSERT_NE(rolled, 0u);
    ASSERT_NO_FATAL_FAILURE(StoreLayers(rolled, 0, 1));
    ASSERT_TRUE(backups_->Rollback(rolled).ok());
    absl::StatusOr<uint64_t> ended = WaitCommittedBounded(rolled);
    EXPECT_EQ(ended.status().code(), absl::StatusCode::kAborted)
        << ended.status();
    EXPECT_TRUE(backups_->Progress(rolled).rolled_back);
    for (Worker& w : workers_) {
      ASSERT_NO_FATAL_FAILURE(
          ExpectBackupEvents(w, rolled, /*committed=*/false, /*max_steps=*/1));
    }
    EXPECT_TRUE(session_->Free(doomed.pages).ok());
  }

  // A load the scheduler starts on the leader.
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  auto loaded = session_->LoadBack(key.tokens);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->ok()) << loaded->done.ShortDebugString()
                            << group_->DescribeLogs(10);
  const uint64_t load = loaded->started.load_id();
  ASSERT_NE(load, 0u);
  for (Worker& w : workers_) {
    ASSERT_NO_FATAL_FAILURE(ExpectLoadEvents(w, load, /*ok=*/true));
  }
  const auto& proto = loaded->started.locations().pages();
  RunWorkers("verify", std::vector<int64_t>(proto.begin(), proto.end()),
             key.seed);
  ASSERT_TRUE(session_->UnlockHandles({loaded->lock_handle()}).ok());

  for (Worker& w : workers_) {
    EXPECT_TRUE(w.backups->Close().ok()) << "rank " << w.rank;
    EXPECT_TRUE(w.backups->TakeErrors().empty()) << "rank " << w.rank;
    w.backups.reset();
    w.events.reset();
    EXPECT_TRUE(w.session->Close().ok()) << "rank " << w.rank;
  }
  ASSERT_NO_FATAL_FAILURE(StopGroupCleanly());
}

// --- Follower -> leader: the workers ack their own layers ---------------------

TEST_P(CpGroupWorkerSplitTest, WorkersAckTheirOwnLayersOnTheirOwnDaemons) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(GetParam()));
  ASSERT_NO_FATAL_FAILURE(OpenEveryWorker());
  const uint32_t steps = layout_.num_steps();
  // The last rank is a follower's in every split here: its worker holds
  // back its last ack.
  const uint32_t held = cp() - 1;
  ASSERT_NE(group_->MemberOfRank(held), 0u);

  uint64_t backup = 0;
  const Key key = WriteAndPrepare(1000, static_cast<int>(2 * cp() + 1), 9,
                                  &backup);
  ASSERT_NE(backup, 0u);
  Insert(key, backup);
  for (Worker& w : workers_) {
    const uint32_t until = w.rank == held ? steps - 1 : steps;
    for (uint32_t step = 0; step < until; ++step) {
      ASSERT_TRUE(w.backups->LayerStored({backup}, step).ok())
          << "rank " << w.rank << " step " << step;
    }
  }
  // Every copy acked so far is done: all but the held one.
  const int all = static_cast<int>(cp() * steps);
  absl::Status waited;
  {
    Watchdog watchdog(kEventTimeout, [this] { backups_->Cancel(); });
    waited = backups_->WaitSteps(backup, all - 1);
  }
  ASSERT_TRUE(waited.ok()) << waited
      << group_->DescribeLogs(10);
  EXPECT_EQ(backups_->Progress(backup).steps_done, all - 1);
  EXPECT_FALSE(backups_->Progress(backup).ended())
      << "the backup ended before rank " << held << "'s last ack";
  EXPECT_EQ(LeaderStats().pending_backups(), 1);

  // The last ack, relayed by the follower: the backup commits.
  ASSERT_TRUE(workers_[held].backups->LayerStored({backup}, steps - 1).ok());
  auto committed = WaitCommittedBounded(backup);
  ASSERT_TRUE(committed.ok()) << committed.status() << group_->DescribeLogs();
  EXPECT_EQ(backups_->Progress(backup).steps_done, all);
  for (Worker& w : workers_) {
    ASSERT_NO_FATAL_FAILURE(ExpectBackupEvents(w, backup, /*committed=*/true));
  }
  // No worker's ack was refused.
  for (Worker& w : workers_) {
    EXPECT_TRUE(w.backups->Close().ok()) << "rank " << w.rank;
    for (const auto& error : w.backups->TakeErrors()) {
      ADD_FAILURE() << "rank " << w.rank << ": " << error.ShortDebugString();
    }
    w.backups.reset();
  }

  // What the workers wrote and acked comes back byte-exact on every rank.
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));
  const v1::CacheStats stats = LeaderStats();
  EXPECT_EQ(stats.backups_committed(), 1);
  EXPECT_EQ(stats.backups_rolled_back(), 0);
  EXPECT_EQ(stats.pending_backups(), 0);
  for (Worker& w : workers_) {
    w.events.reset();
    EXPECT_TRUE(w.session->Close().ok()) << "rank " << w.rank;
  }
  ASSERT_NO_FATAL_FAILURE(StopGroupCleanly());
}

INSTANTIATE_TEST_SUITE_P(
    Splits, CpGroupWorkerSplitTest,
    ::testing::Values(Spec(4, {{0, 1}, {2, 3}}), Spec(2, {{0}, {1}})),
    [](const ::testing::TestParamInfo<GroupSpec>& info) {
      return SplitLabel(info.param);
    });

// --- Refusals ---------------------------------------------------------------

TEST_F(CpGroupWorkerTest, FollowerRefusesForeignRanksNamespacesAndFences) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0, 1}, {2, 3}})));
  const size_t follower = 1;
  const uint32_t rank = 2;  // The follower's.
  ASSERT_EQ(group_->MemberOfRank(rank), follower);
  uint64_t backup = 0;
  const Key key = WriteAndPrepare(1000, 9, 17, &backup);
  ASSERT_NE(backup, 0u);
  Insert(key, backup);
  ASSERT_EQ(LeaderStats().pending_backups(), 1);

  // A worker session on the follower for a rank the follower does not hold
  // (the leader's rank 0) is refused when it opens, naming the ranks held
  // there: it could neither map the rank's pools nor ack its layers.
  {
    auto foreign = OpenWorker(/*rank=*/0, follower);
    ASSERT_FALSE(foreign.ok()) << "a follower opened a worker of rank 0";
    EXPECT_EQ(foreign.status().code(), absl::StatusCode::kFailedPrecondition)
        << foreign.status();
    EXPECT_TRUE(absl::StrContains(foreign.status().message(), "rank 0"))
        << foreign.status();
    EXPECT_TRUE(absl::StrContains(foreign.status().message(), "ranks 2,3"))
        << foreign.status();
  }
  // An op of another namespace: a worker of the right rank, another ns.
  {
    auto other = OpenWorker(rank, follower, "other-ns");
    ASSERT_TRUE(other.ok()) << other.status();
    auto stream = other->session->OpenBackupStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    other->backups = *std::move(stream);
    auto error = AckExpectingError(*other, backup, 0);
    ASSERT_TRUE(error.ok()) << error.status();
    EXPECT_EQ(error->code(), static_cast<int>(absl::StatusCode::kInvalidArgument))
        << error->ShortDebugString();
    std::printf("[cp_group] follower ack of another namespace's op: %s\n",
                error->ShortDebugString().c_str());
    other->backups->Cancel();
  }
  // A fence on a follower.
  auto own = OpenWorker(rank);
  ASSERT_TRUE(own.ok()) << own.status();
  {
    auto stream = own->session->OpenBackupStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    own->backups = *std::move(stream);
    v1::RankFence fence;
    fence.set_rank(rank);
    fence.set_fence_id(1);
    auto error = AckExpectingError(*own, backup, 0, {fence});
    ASSERT_TRUE(error.ok()) << error.status();
    EXPECT_EQ(error->code(),
              static_cast<int>(absl::StatusCode::kFailedPrecondition))
        << error->ShortDebugString();
    EXPECT_TRUE(absl::StrContains(
        error->message(), "fences on a CP group follower are not supported yet"))
        << error->ShortDebugString();
  }
  // Relayed to the leader and refused there, the answer coming back to the
  // worker: a step past the layout, a backup id nobody prepared.
  for (const auto& [ids, step, what] :
       std::vector<std::tuple<std::vector<uint64_t>, uint32_t, std::string>>{
           {{backup}, layout_.num_steps(), "a step past the layout"},
           {{backup + 1000}, 0, "an unknown backup id"},
           {{backup, backup}, 0, "a backup id named twice"}}) {
    ASSERT_TRUE(own->backups->LayerStored(ids, step).ok()) << what;
    Watchdog watchdog(kEventTimeout, [&own] { own->backups->Cancel(); });
    absl::StatusOr<v1::BackupServerMessage> reply = own->backups->Next();
    ASSERT_TRUE(reply.ok()) << what << ": " << reply.status();
    std::printf("[cp_group] follower ack of %s: %s\n", what.c_str(),
                reply->ShortDebugString().c_str());
    ASSERT_TRUE(reply->has_error()) << what << ": " << reply->ShortDebugString();
    EXPECT_EQ(reply->error().code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument))
        << what << ": " << reply->ShortDebugString();
  }
  // Nothing changed: no step of the backup is done, and the first real ack
  // (rank 2, step 0) makes exactly one step done.
  EXPECT_EQ(backups_->Progress(backup).steps_done, 0);
  EXPECT_FALSE(backups_->Progress(backup).ended());
  ASSERT_TRUE(own->backups->LayerStored({backup}, 0).ok());
  {
    Watchdog watchdog(kEventTimeout, [this] { backups_->Cancel(); });
    const absl::Status waited = backups_->WaitSteps(backup, 1);
    ASSERT_TRUE(waited.ok()) << waited << group_->DescribeLogs(10);
  }
  EXPECT_EQ(backups_->Progress(backup).steps_done, 1);
  EXPECT_FALSE(backups_->Progress(backup).ended());
  EXPECT_EQ(LeaderStats().pending_backups(), 1);

  // The scheduler acks the rest (a repeated ack of a done copy included)
  // and the backup commits: the refusals harmed nothing.
  ASSERT_NO_FATAL_FAILURE(StoreLayers(backup, 0, layout_.num_steps()));
  auto committed = WaitCommittedBounded(backup);
  ASSERT_TRUE(committed.ok()) << committed.status() << group_->DescribeLogs();
  EXPECT_EQ(backups_->Progress(backup).steps_done,
            static_cast<int>(cp() * layout_.num_steps()));
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  // The leader dies: the follower's relayed ack fails (an error, or the
  // stream ends), and the follower exits non-zero.
  uint64_t doomed = 0;
  WriteAndPrepare(30000, 9, 18, &doomed);
  ASSERT_NE(doomed, 0u);
  backups_->Cancel();
  ASSERT_TRUE(group_->Kill(0).ok());
  {
    auto error = AckExpectingError(*own, doomed, 0);
    if (error.ok()) {
      EXPECT_EQ(error->code(), static_cast<int>(absl::StatusCode::kUnavailable))
          << error->ShortDebugString();
    }
    std::printf("[cp_group] follower ack after the leader's SIGKILL: %s\n",
                error.ok() ? error->ShortDebugString().c_str()
                           : error.status().ToString().c_str());
  }
  auto code = group_->WaitExit(
      follower,
      absl::Milliseconds(group_->spec().timeout_ms) + absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << code.status() << group_->DescribeLogs();
  EXPECT_NE(*code, 0) << group_->Log(follower);
  EXPECT_LT(*code, 128) << "killed by a signal: " << group_->Log(follower);
  EXPECT_FALSE(absl::StrContains(group_->Log(follower), "Sanitizer"))
      << group_->Log(follower);
  own->backups->Cancel();
  backups_.reset();
}

}  // namespace
}  // namespace hicache::cp_group_testing
