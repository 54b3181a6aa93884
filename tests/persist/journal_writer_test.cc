#include "daemon/persist/journal_writer.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/persist/journal_reader.h"
#include "daemon/persist/posix_journal_fs.h"
#include "daemon/persist/state_dir.h"
#include "gtest/gtest.h"
#include "tests/persist/journal_test_util.h"
#include "tests/testing/temp_dir.h"

namespace hicache::persist {
namespace {

using testing::MakePut;
using testing::TestGeometry;

// Real files, with failures and stalls injected on demand.
class FaultyFs : public JournalFs {
 public:
  std::atomic<bool> fail_append{false};
  std::atomic<bool> fail_sync{false};
  std::atomic<bool> fail_create{false};
  std::atomic<bool> fail_sync_dir{false};
  std::atomic<int64_t> appends{0};
  std::atomic<int64_t> syncs{0};
  // While set, Append waits for `release` (a stalled disk).
  std::atomic<bool> stall{false};
  absl::Notification release;
  absl::Notification stalled;  // Notified when an Append starts stalling.

  // While set, Create waits for `release_create` (a compaction in progress).
  std::atomic<bool> stall_create{false};
  absl::Notification release_create;
  absl::Notification create_stalled;

  absl::StatusOr<std::unique_ptr<JournalFile>> Create(
      const std::string& path) override {
    if (stall_create) {
      if (!create_stalled.HasBeenNotified()) create_stalled.Notify();
      release_create.WaitForNotification();
    }
    if (fail_create) return absl::ResourceExhaustedError("injected: no space");
    absl::StatusOr<std::unique_ptr<JournalFile>> file =
        PosixJournalFs::Default()->Create(path);
    if (!file.ok()) return file.status();
    return std::unique_ptr<JournalFile>(new File(this, *std::move(file)));
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return PosixJournalFs::Default()->Rename(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    if (fail_sync_dir) return absl::InternalError("injected: dir fsync");
    return PosixJournalFs::Default()->SyncDir(dir);
  }
  absl::Status Remove(const std::string& path) override {
    return PosixJournalFs::Default()->Remove(path);
  }

 private:
  class File : public JournalFile {
   public:
    File(FaultyFs* fs, std::unique_ptr<JournalFile> real)
        : fs_(fs), real_(std::move(real)) {}
    absl::Status Append(absl::string_view data) override {
      if (fs_->stall) {
        if (!fs_->stalled.HasBeenNotified()) fs_->stalled.Notify();
        fs_->release.WaitForNotification();
      }
      ++fs_->appends;
      if (fs_->fail_append) {
        // A short write then ENOSPC: half the batch reaches the file.
        (void)real_->Append(data.substr(0, data.size() / 2));
        return absl::ResourceExhaustedError("injected: write: no space");
      }
      return real_->Append(data);
    }
    absl::Status Sync() override {
      ++fs_->syncs;
      if (fs_->fail_sync) return absl::InternalError("injected: fdatasync EIO");
      return real_->Sync();
    }

   private:
    FaultyFs* const fs_;
    std::unique_ptr<JournalFile> real_;
  };
};

class JournalWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.Child("state");
    ASSERT_TRUE(PrepareStateDir(dir_).ok());
  }

  std::unique_ptr<JournalWriter> Open(JournalWriterOptions options = {},
                                      const std::vector<PutRecord>& live = {}) {
    if (options.fs == nullptr) options.fs = &fs_;
    absl::StatusOr<std::unique_ptr<JournalWriter>> w =
        JournalWriter::Open(dir_, g_, live, options);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *std::move(w) : nullptr;
  }

  LoadedJournal Load() {
    absl::StatusOr<LoadedJournal> loaded = LoadJournal(dir_, &g_);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? *std::move(loaded) : LoadedJournal{};
  }

  hicache::testing::TempDir tmp_;
  std::string dir_;
  JournalGeometry g_ = TestGeometry(2);
  FaultyFs fs_;
  std::mt19937_64 rng_{11};
};

TEST_F(JournalWriterTest, FreshJournalHasTheGeometryAndModes) {
  {
    std::unique_ptr<JournalWriter> w = Open();
    ASSERT_NE(w, nullptr);
    EXPECT_TRUE(w->status().ok());
  }
  LoadedJournal loaded = Load();
  EXPECT_EQ(loaded.geometry, g_);
  EXPECT_TRUE(loaded.puts.empty());
  EXPECT_TRUE(loaded.stop_reason.empty());
  struct stat st;
  ASSERT_EQ(::stat(JournalPath(dir_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_NE(::access(JournalTmpPath(dir_).c_str(), F_OK), 0);
}

TEST_F(JournalWriterTest, FlushMakesRecordsVisibleToAFreshReader) {
  std::unique_ptr<JournalWriter> w =
      Open({.max_delay = absl::Seconds(30)});  // Only Flush writes early.
  const PutRecord a = MakePut(1, 0, "ns", 3, g_, rng_);
  const PutRecord b = MakePut(2, 1, "ns", 2, g_, rng_);
  ASSERT_TRUE(w->Put(a).ok());
  ASSERT_TRUE(w->Put(b).ok());
  EXPECT_TRUE(Load().puts.empty());  // Queued, not written: 30 s delay.
  ASSERT_TRUE(w->Flush().ok());
  LoadedJournal loaded = Load();  // While the writer is still open.
  ASSERT_EQ(loaded.puts.size(), 2u);
  EXPECT_EQ(loaded.puts[0], a);
  EXPECT_EQ(loaded.puts[1], b);
  ASSERT_TRUE(w->Drop(2).ok());
  ASSERT_TRUE(w->Drop(12345).ok());  // Not live: nothing written.
  ASSERT_TRUE(w->FlushClean().ok());
  loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 1u);
  EXPECT_TRUE(loaded.clean);
  EXPECT_EQ(loaded.unknown_drops, 0);
  const JournalWriterStats stats = w->stats();
  EXPECT_EQ(stats.puts, 2);
  EXPECT_EQ(stats.drops, 1);
  EXPECT_EQ(stats.unknown_drops, 1);
  EXPECT_EQ(stats.live_puts, 1);
  EXPECT_EQ(stats.queued_bytes, 0u);
  EXPECT_EQ(stats.file_bytes, loaded.file_bytes);
  // The lock-free summary (GetStats, metrics) agrees.
  const JournalWriter::Summary summary = w->summary();
  EXPECT_EQ(summary.live_puts, 1);
  EXPECT_EQ(summary.file_bytes, loaded.file_bytes);
  EXPECT_FALSE(summary.broken);
}

TEST_F(JournalWriterTest, TheDestructorWritesWhatIsQueued) {
  {
    std::unique_ptr<JournalWriter> w = Open({.max_delay = absl::Seconds(30)});
    for (uint64_t id = 1; id <= 10; ++id) {
      ASSERT_TRUE(w->Put(MakePut(id, id - 1, "ns", 1, g_, rng_)).ok());
    }
  }
  EXPECT_EQ(Load().puts.size(), 10u);
}

TEST_F(JournalWriterTest, GroupCommitBatchesConcurrentAppends) {
  std::unique_ptr<JournalWriter> w = Open({.max_delay = absl::Milliseconds(5)});
  const int kThreads = 4, kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t id = 1 + t * kPerThread + i;
        ASSERT_TRUE(w->Put(MakePut(id, 0, "ns", 1, g_, rng)).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(w->Flush().ok());
  const JournalWriterStats stats = w->stats();
  EXPECT_EQ(stats.puts, kThreads * kPerThread);
  // One fdatasync per batch, far fewer batches than records.
  EXPECT_EQ(fs_.syncs.load(), stats.batches + 1);  // + the initial file.
  EXPECT_LT(stats.batches, kThreads * kPerThread / 10);
  EXPECT_EQ(Load().puts.size(), static_cast<size_t>(kThreads * kPerThread));
}

TEST_F(JournalWriterTest, PutValidatesAgainstTheGeometry) {
  std::unique_ptr<JournalWriter> w = Open();
  PutRecord bad = MakePut(1, 0, "ns", 2, g_, rng_);
  bad.page_owners[0] = 7;
  EXPECT_EQ(w->Put(bad).code(), absl::StatusCode::kInvalidArgument);
  const PutRecord good = MakePut(1, 0, "ns", 2, g_, rng_);
  ASSERT_TRUE(w->Put(good).ok());
  EXPECT_EQ(w->Put(good).code(), absl::StatusCode::kInvalidArgument);  // Live.
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(Load().puts.size(), 1u);
  EXPECT_TRUE(w->status().ok());
}

TEST_F(JournalWriterTest, AFailedWriteBreaksTheJournal) {
  std::unique_ptr<JournalWriter> w = Open();
  ASSERT_TRUE(w->Put(MakePut(1, 0, "ns", 2, g_, rng_)).ok());
  ASSERT_TRUE(w->Flush().ok());
  fs_.fail_append = true;
  ASSERT_TRUE(w->Put(MakePut(2, 1, "ns", 2, g_, rng_)).ok());
  const absl::Status flushed = w->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(flushed.message().find("no space"), std::string::npos) << flushed;
  EXPECT_EQ(w->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(w->summary().broken);
  EXPECT_EQ(w->Put(MakePut(3, 1, "ns", 2, g_, rng_)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Drop(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->FlushClean().code(), absl::StatusCode::kFailedPrecondition);
  w.reset();  // Stops cleanly.
  // The half-written batch is a torn tail: record 1 survives.
  LoadedJournal loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 1u);
  EXPECT_EQ(loaded.puts[0].persist_id, 1u);
  EXPECT_GT(loaded.dropped_bytes, 0u);
}

TEST_F(JournalWriterTest, AFailedSyncBreaksTheJournal) {
  std::unique_ptr<JournalWriter> w = Open();
  fs_.fail_sync = true;
  ASSERT_TRUE(w->Put(MakePut(1, 0, "ns", 2, g_, rng_)).ok());
  EXPECT_EQ(w->Flush().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(w->status().message().find("EIO"), std::string::npos);
}

TEST_F(JournalWriterTest, OpenFailsCleanlyAndKeepsTheOldJournal) {
  {
    std::unique_ptr<JournalWriter> w = Open();
    ASSERT_TRUE(w->Put(MakePut(1, 0, "ns", 2, g_, rng_)).ok());
  }
  fs_.fail_create = true;
  JournalWriterOptions options;
  options.fs = &fs_;
  absl::StatusOr<std::unique_ptr<JournalWriter>> w =
      JournalWriter::Open(dir_, g_, {}, options);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Load().puts.size(), 1u);
  fs_.fail_create = false;
  // A live set that does not fit the geometry is refused.
  PutRecord bad = MakePut(1, 0, "ns", 2, g_, rng_);
  bad.logical_len = 0;
  EXPECT_EQ(JournalWriter::Open(dir_, g_, {bad}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  const PutRecord dup = MakePut(1, 0, "ns", 2, g_, rng_);
  EXPECT_EQ(JournalWriter::Open(dir_, g_, {dup, dup}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  JournalGeometry zero_ranks = g_;
  zero_ranks.cp_size = 0;
  EXPECT_EQ(JournalWriter::Open(dir_, zero_ranks, {}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Load().puts.size(), 1u);
}

// summary().not_durable_records: what a crash now would lose of the
// records accepted (GetStats and the metrics; tests wait for it to be 0).
TEST_F(JournalWriterTest, TheSummaryCountsRecordsNotDurableYet) {
  std::unique_ptr<JournalWriter> w = Open({.max_delay = absl::Hours(1)});
  EXPECT_EQ(w->summary().not_durable_records, 0u);
  ASSERT_TRUE(w->Put(MakePut(1, 0, "ns", 1, g_, rng_)).ok());
  ASSERT_TRUE(w->Put(MakePut(2, 1, "ns", 1, g_, rng_)).ok());
  ASSERT_TRUE(w->Drop(2).ok());
  EXPECT_EQ(w->summary().not_durable_records, 3u);  // Waiting for max_delay.
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(w->summary().not_durable_records, 0u);
}

TEST_F(JournalWriterTest, AFullQueueRefusesPutsButNeverDrops) {
  std::unique_ptr<JournalWriter> w =
      Open({.max_delay = absl::ZeroDuration(), .max_queue_bytes = 4096});
  ASSERT_TRUE(w->Put(MakePut(1, 0, "ns", 1, g_, rng_)).ok());
  ASSERT_TRUE(w->Flush().ok());
  fs_.stall = true;
  ASSERT_TRUE(w->Put(MakePut(2, 1, "ns", 1, g_, rng_)).ok());
  fs_.stalled.WaitForNotification();  // The writer is stuck in a write.
  int accepted = 0;
  absl::Status refused;
  for (uint64_t id = 3; id < 200 && refused.ok(); ++id) {
    refused = w->Put(MakePut(id, 1, "ns", 1, g_, rng_));
    if (refused.ok()) ++accepted;
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_GT(accepted, 0);
  EXPECT_EQ(w->stats().puts_refused, 1);
  // Drops are accepted beyond the bound.
  for (uint64_t id = 3; id < 3 + static_cast<uint64_t>(accepted); ++id) {
    EXPECT_TRUE(w->Drop(id).ok());
  }
  EXPECT_TRUE(w->status().ok());
  fs_.stall = false;
  fs_.release.Notify();
  ASSERT_TRUE(w->Flush().ok());
  LoadedJournal loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 2u);  // 1 and 2; the rest dropped.
  EXPECT_EQ(w->stats().live_puts, 2);
}

TEST_F(JournalWriterTest, CompactionRewritesTheLiveSetParentsFirst) {
  std::unique_ptr<JournalWriter> w = Open(
      {.max_delay = absl::ZeroDuration(), .compaction_floor_bytes = 16384});
  std::map<uint64_t, PutRecord> model;
  // Children before parents in id order: 100 is the root of 1..50.
  ASSERT_TRUE(w->Put(MakePut(100, 0, "ns", 1, g_, rng_)).ok());
  model[100] = MakePut(100, 0, "ns", 1, g_, rng_);
  ASSERT_TRUE(w->Drop(100).ok());
  model.erase(100);
  const PutRecord root = MakePut(100000, 0, "ns", 1, g_, rng_);
  ASSERT_TRUE(w->Put(root).ok());
  model[root.persist_id] = root;
  for (int round = 0; round < 30; ++round) {
    for (uint64_t i = 1; i <= 20; ++i) {
      const uint64_t id = round * 100 + i;
      PutRecord put = MakePut(id, 100000, "ns", 2, g_, rng_);
      ASSERT_TRUE(w->Put(put).ok());
      model[id] = put;
    }
    for (uint64_t i = 1; i <= 18; ++i) {
      ASSERT_TRUE(w->Drop(round * 100 + i).ok());
      model.erase(round * 100 + i);
    }
    ASSERT_TRUE(w->Flush().ok());
  }
  const JournalWriterStats stats = w->stats();
  EXPECT_GE(stats.compactions, 1);
  EXPECT_LE(stats.file_bytes,
            std::max<uint64_t>(16384, 2 * stats.live_bytes) + 40 * 1024);
  LoadedJournal loaded = Load();
  EXPECT_EQ(loaded.file_bytes, stats.file_bytes);
  ASSERT_EQ(loaded.puts.size(), model.size());
  EXPECT_EQ(loaded.puts[0], root);
  for (const PutRecord& put : loaded.puts)
    EXPECT_EQ(put, model[put.persist_id]);
  EXPECT_NE(::access(JournalTmpPath(dir_).c_str(), F_OK), 0);
}

TEST_F(JournalWriterTest, AFailedCompactionKeepsTheOldJournal) {
  std::unique_ptr<JournalWriter> w =
      Open({.max_delay = absl::ZeroDuration(), .compaction_floor_bytes = 4096});
  fs_.fail_create = true;
  for (uint64_t id = 1; id <= 60; ++id) {
    ASSERT_TRUE(w->Put(MakePut(id, 0, "ns", 2, g_, rng_)).ok());
    if (id > 2) {
      ASSERT_TRUE(w->Drop(id - 1).ok());
    }
    ASSERT_TRUE(w->Flush().ok());
  }
  JournalWriterStats stats = w->stats();
  EXPECT_GE(stats.compaction_failures, 1);
  EXPECT_EQ(stats.compactions, 0);
  EXPECT_TRUE(w->status().ok());
  LoadedJournal loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 2u);
  fs_.fail_create = false;
  for (uint64_t id = 61; id <= 200; ++id) {
    ASSERT_TRUE(w->Put(MakePut(id, 0, "ns", 2, g_, rng_)).ok());
    ASSERT_TRUE(w->Drop(id - 1).ok());
    ASSERT_TRUE(w->Flush().ok());
  }
  stats = w->stats();
  EXPECT_GE(stats.compactions, 1);
  loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 2u);
  EXPECT_EQ(loaded.puts[0].persist_id, 1u);
  EXPECT_EQ(loaded.puts[1].persist_id, 200u);
}

TEST_F(JournalWriterTest, ADirectorySyncFailureAfterTheRenameBreaksTheJournal) {
  std::unique_ptr<JournalWriter> w =
      Open({.max_delay = absl::ZeroDuration(), .compaction_floor_bytes = 4096});
  fs_.fail_sync_dir = true;
  absl::Status s;
  for (uint64_t id = 1; id <= 200 && s.ok(); ++id) {
    s = w->Put(MakePut(id, 0, "ns", 2, g_, rng_));
    if (s.ok() && id > 1) s = w->Drop(id - 1);
    if (s.ok()) s = w->Flush();
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(w->status().message().find("dir fsync"), std::string::npos)
      << w->status();
}

// CompactNow compacts whatever the size and returns once it is done (or
// failed, keeping the old journal), so a test counts it without waiting.
TEST_F(JournalWriterTest, CompactNowCompactsAndReturnsWhenDone) {
  std::unique_ptr<JournalWriter> w =
      Open({.max_delay = absl::Seconds(10), .compaction_floor_bytes = 1 << 30});
  for (uint64_t id = 1; id <= 10; ++id) {
    ASSERT_TRUE(w->Put(MakePut(id, 0, "ns", 1, g_, rng_)).ok());
  }
  for (uint64_t id = 1; id <= 8; ++id) ASSERT_TRUE(w->Drop(id).ok());
  // Pending (a 10 s batch delay), far below the compaction floor.
  ASSERT_TRUE(w->CompactNow().ok());
  EXPECT_EQ(w->stats().compactions, 1);
  EXPECT_EQ(w->stats().compaction_failures, 0);
  LoadedJournal loaded = Load();  // The snapshot subsumed what was pending.
  ASSERT_EQ(loaded.puts.size(), 2u);
  EXPECT_EQ(loaded.puts[0].persist_id, 9u);

  fs_.fail_create = true;
  ASSERT_TRUE(w->Put(MakePut(11, 0, "ns", 1, g_, rng_)).ok());
  const absl::Status failed = w->CompactNow();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_EQ(w->stats().compaction_failures, 1);
  EXPECT_TRUE(w->status().ok());  // The old journal is still in use.
  fs_.fail_create = false;
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(Load().puts.size(), 3u);
}

// The compaction writes outside the lock: while it is stuck in the file
// system, Put, Drop, stats() and status() still return at once, and what
// they record lands in the compacted journal.
TEST_F(JournalWriterTest, CompactionDoesNotBlockAppends) {
  std::unique_ptr<JournalWriter> w =
      Open({.max_delay = absl::ZeroDuration(), .compaction_floor_bytes = 4096});
  fs_.stall_create = true;
  uint64_t id = 0;
  // Churn until the writer starts a compaction (and stalls in Create).
  while (!fs_.create_stalled.HasBeenNotified()) {
    ASSERT_TRUE(w->Put(MakePut(++id, 0, "ns", 2, g_, rng_)).ok());
    if (id > 1) {
      ASSERT_TRUE(w->Drop(id - 1).ok());
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  // The compaction stays stuck until released below: a Put or Drop that
  // waited for it would never return (the test would time out).
  for (uint64_t more = id + 1; more <= id + 50; ++more) {
    ASSERT_TRUE(w->Put(MakePut(more, id, "ns", 2, g_, rng_)).ok());
  }
  ASSERT_TRUE(w->Drop(id + 50).ok());
  EXPECT_TRUE(w->status().ok());
  EXPECT_GE(w->stats().live_puts, 50);
  EXPECT_EQ(w->stats().compactions, 0);  // Still stuck.
  fs_.stall_create = false;
  fs_.release_create.Notify();
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_GE(w->stats().compactions, 1);
  LoadedJournal loaded = Load();
  ASSERT_EQ(loaded.puts.size(), 50u);  // id and its 49 live children.
  EXPECT_EQ(loaded.puts[0].persist_id, id);
}

// A process that dies without its destructor (SIGKILL): what Flush returned
// for is in the journal; what was only queued is not, and the journal loads.
TEST_F(JournalWriterTest, FlushedRecordsSurviveAProcessDeath) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    JournalWriterOptions options;
    options.max_delay = absl::Seconds(60);
    auto w = JournalWriter::Open(dir_, g_, {}, options);
    if (!w.ok()) ::_exit(2);
    std::mt19937_64 rng(5);
    for (uint64_t id = 1; id <= 20; ++id) {
      if (!(*w)->Put(MakePut(id, 0, "ns", 2, g_, rng)).ok()) ::_exit(3);
    }
    if (!(*w)->Flush().ok()) ::_exit(4);
    for (uint64_t id = 21; id <= 30; ++id) {
      if (!(*w)->Put(MakePut(id, 0, "ns", 2, g_, rng)).ok()) ::_exit(5);
    }
    ::kill(::getpid(), SIGKILL);
    ::_exit(6);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited " << WEXITSTATUS(wstatus);
  EXPECT_EQ(WTERMSIG(wstatus), SIGKILL);
  LoadedJournal loaded = Load();
  EXPECT_TRUE(loaded.stop_reason.empty()) << loaded.stop_reason;
  ASSERT_EQ(loaded.puts.size(), 20u);
  EXPECT_EQ(loaded.puts.back().persist_id, 20u);
  // And a writer continues from it.
  std::unique_ptr<JournalWriter> w = Open({}, loaded.puts);
  ASSERT_TRUE(w->Put(MakePut(21, 20, "ns", 1, g_, rng_)).ok());
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(Load().puts.size(), 21u);
}

// Random Put/Drop sequences against a std::map, across restarts (load, then
// a new writer continuing from the loaded live set) and compactions.
TEST_F(JournalWriterTest, ModelTestAcrossRestartsAndCompactions) {
  std::map<uint64_t, PutRecord> model;
  uint64_t next_id = 1;
  std::vector<PutRecord> live;
  int64_t compactions = 0;
  for (int restart = 0; restart < 6; ++restart) {
    std::unique_ptr<JournalWriter> w =
        // At the test's priority: a background writer would fall behind
        // the test thread and write (and compact) in a few large batches.
        Open({.max_delay = absl::Microseconds(200),
              .compaction_floor_bytes = 32 * 1024,
              .background = false},
             live);
    ASSERT_NE(w, nullptr);
    for (int op = 0; op < 1500; ++op) {
      // Flushes and one forced compaction per restart, in the middle of
      // the traffic (whatever compactions the file's growth also makes
      // happen when the writer thread gets to them: not counted).
      if (op % 500 == 499) {
        ASSERT_TRUE(w->Flush().ok());
      }
      if (op == 750) {
        const int64_t before = w->stats().compactions;
        ASSERT_TRUE(w->CompactNow().ok());
        ASSERT_GT(w->stats().compactions, before);
      }
      // Growing phases, then shrinking ones (which compact).
      const uint64_t put_percent = restart % 2 == 0 ? 70 : 25;
      if (rng_() % 100 < put_percent || model.empty()) {
        // A child of a random live node (same namespace) or a new root.
        uint64_t parent = 0;
        std::string ns = "ns" + std::to_string(rng_() % 3);
        if (!model.empty() && rng_() % 4 != 0) {
          auto it = model.lower_bound(rng_() % next_id);
          if (it == model.end()) it = model.begin();
          parent = it->first;
          ns = it->second.name_space;
        }
        PutRecord put = MakePut(next_id++, parent, ns,
                                1 + static_cast<int>(rng_() % 6), g_, rng_);
        ASSERT_TRUE(w->Put(put).ok());
        model[put.persist_id] = std::move(put);
      } else {
        // Drop a leaf (the engine evicts leaves first): a random one, or
        // the newest (always a leaf: children have larger ids), which
        // churns the file without shrinking the live set much.
        auto it = rng_() % 2 == 0 ? model.lower_bound(rng_() % next_id)
                                  : std::prev(model.end());
        if (it == model.end()) it = model.begin();
        bool has_child = false;
        for (const auto& [id, put] : model) {
          if (put.parent_persist_id == it->first) {
            has_child = true;
            break;
          }
        }
        if (has_child) continue;
        ASSERT_TRUE(w->Drop(it->first).ok());
        model.erase(it);
      }
    }
    if (restart % 2 == 0) {
      ASSERT_TRUE(w->Flush().ok());  // Else: the destructor writes the rest.
    }
    compactions += w->stats().compactions;
    EXPECT_TRUE(w->status().ok());
    w.reset();
    LoadedJournal loaded = Load();
    EXPECT_TRUE(loaded.stop_reason.empty()) << loaded.stop_reason;
    EXPECT_EQ(loaded.orphans, 0);
    ASSERT_EQ(loaded.puts.size(), model.size()) << "restart " << restart;
    std::map<uint64_t, size_t> position;
    for (size_t i = 0; i < loaded.puts.size(); ++i) {
      const PutRecord& put = loaded.puts[i];
      ASSERT_TRUE(model.contains(put.persist_id));
      EXPECT_EQ(put, model[put.persist_id]);
      position[put.persist_id] = i;
      if (put.parent_persist_id != 0) {
        ASSERT_TRUE(position.contains(put.parent_persist_id))
            << "parent after child";
      }
    }
    live = std::move(loaded.puts);
  }
  EXPECT_GE(compactions, 6);  // At least the forced one of each restart.
}

}  // namespace
}  // namespace hicache::persist
