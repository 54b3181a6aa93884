// Bugs found while writing the stream_abuse_*_test files against a real
// hicached process (stream_abuse_support.h), each now a regression test:
// Complete all or nothing across items, workers hearing an Admit backup, a
// deferred Complete keeping its backup for the retry, and Admit's zigzag
// covering the input only.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/integration/stream_abuse_support.h"
#include "tests/testing/tokens.h"

namespace hicache::stream_abuse_testing {
namespace {

using testing::Pack;
using testing::Seq;

// --- Bugs found here, now fixed ---------------------------------------------

// Complete is all or nothing across items (found here, fixed in 8485d5a):
// an item whose insert names pages the session does not hold, or a page
// that another item of the call inserts or frees, used to fail only when its
// turn came -- after the earlier items were inserted, unlocked and freed --
// so the client saw an error, never the earlier items' results, and a retry
// of the fixed call failed on their released handles.
TEST_F(StreamAbuseTest, CompleteIsAllOrNothingAcrossItems) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string a_id = Open(v1::ROLE_SCHEDULER);
  const std::string b_id = Open(v1::ROLE_SCHEDULER);
  Cache(a_id, Seq(0, 2 * kPage));
  const std::vector<int32_t> first = Seq(0, 3 * kPage);
  const std::vector<int32_t> second = Seq(1000, 2 * kPage);
  const v1::AdmitResult one = AdmitOne(a_id, first);
  const v1::AdmitResult two = AdmitOne(a_id, second);
  const v1::AdmitResult theirs = AdmitOne(b_id, Seq(2000, 2 * kPage));
  ASSERT_NE(one.lock_handle(), 0u);
  // Item 1 caches its tokens in session B's pages.
  v1::CompleteRequest request;
  request.set_session_id(a_id);
  *request.add_items() = CompleteItemFor(one, first);
  v1::CompleteItem foreign = CompleteItemFor(two, second);
  foreign.clear_pages();
  foreign.mutable_pages()->Add(theirs.pages().begin(), theirs.pages().end());
  *request.add_items() = foreign;
  const Snapshot before = Snap();
  v1::CompleteResponse response;
  grpc::Status status = Complete(request, &response);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Snap(), before)
      << "a refused Complete changed item 0 (inserted, unlocked, freed)";
  // Item 1 frees a page that item 0 inserts.
  const v1::AdmitResult three = AdmitOne(a_id, Seq(3000, 2 * kPage));
  const v1::AdmitResult four = AdmitOne(a_id, Seq(4000, 2 * kPage));
  v1::CompleteRequest overlap;
  overlap.set_session_id(a_id);
  *overlap.add_items() = CompleteItemFor(three, Seq(3000, 2 * kPage));
  v1::CompleteItem frees = CompleteItemFor(four, Seq(4000, 2 * kPage));
  frees.add_free_pages(three.pages(0));
  *overlap.add_items() = frees;
  const Snapshot before_overlap = Snap();
  status = Complete(overlap, &response);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Snap(), before_overlap)
      << "a refused Complete inserted item 0 and inserted and unlocked item 1";
}

// The workers hear a backup that Admit prepared (fixed in d703423: Admit's
// backups were never tagged with their namespace in the EventHub, so the
// workers' Subscribe streams heard neither its backup_step nor its
// backup_ended although they acked its layers themselves).
TEST_F(StreamAbuseTest, WorkersHearAnAdmitBackup) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  std::vector<std::string> workers;
  std::vector<std::unique_ptr<Subscription>> subs;
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    workers.push_back(Open(v1::ROLE_WORKER, rank));
    auto sub = Subscription::Open(stub_.get(), workers.back(), true);
    ASSERT_TRUE(sub.ok()) << sub.status();
    subs.push_back(*std::move(sub));
  }
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  const v1::AdmitResult a =
      AdmitOne(scheduler, tokens, 0, v1::BACKUP_CHOICE_ALWAYS);
  const uint64_t backup = a.backup_id();
  ASSERT_NE(backup, 0u);
  // Each worker acks its own rank's layers on its own stream.
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    BackupStream stream(stub_.get(), workers[rank]);
    for (uint32_t step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(stream.LayerStored({backup}, step));
    }
    ASSERT_TRUE(stream.Close().ok());
    EXPECT_TRUE(stream.Errors().empty());
  }
  v1::CompleteResponse response;
  ASSERT_TRUE(
      CompleteOne(scheduler, CompleteItemFor(a, tokens), &response).ok());
  EXPECT_TRUE(response.results(0).backup_attached());
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    const bool heard = subs[rank]->WaitFor(
        [&](const auto& events) {
          int steps = 0;
          bool ended = false;
          for (const v1::WorkerEvent& e : events) {
            steps += e.has_backup_step() &&
                     e.backup_step().backup_id() == backup && e.rank() == rank;
            ended |= e.has_backup_ended() &&
                     e.backup_ended().backup_id() == backup &&
                     e.backup_ended().committed();
          }
          return steps == static_cast<int>(kSteps) && ended;
        },
        absl::Seconds(3));
    EXPECT_TRUE(heard) << "worker " << rank << " heard " << subs[rank]->count()
                       << " events of the Admit backup " << backup
                       << " (expected " << kSteps
                       << " backup_step and its backup_ended)";
  }
}

// A deferred insert changes nothing, its backup included (it used to be
// rolled back and forgotten, so the documented retry of the item was refused
// with "backup_id N is not a backup of this session").
TEST_F(StreamAbuseTest, DeferredCompleteKeepsItsBackupForTheRetry) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  // Two requests sharing a prefix with a sub-page tail, both admitted
  // before either completes: nothing is cached yet, both get a backup.
  const std::vector<int32_t> shorter = Seq(0, 2 * kPage + 2);
  std::vector<int32_t> longer = shorter;
  for (int32_t t : Seq(100, kPage + 2)) longer.push_back(t);
  const v1::AdmitResult y =
      AdmitOne(scheduler, longer, 0, v1::BACKUP_CHOICE_ALWAYS);
  const v1::AdmitResult x =
      AdmitOne(scheduler, shorter, 0, v1::BACKUP_CHOICE_ALWAYS);
  ASSERT_NE(y.backup_id(), 0u);
  ASSERT_NE(x.backup_id(), 0u);
  ASSERT_FALSE(y.tail_blocked());
  // The shorter one completes first: its node's backup is in flight.
  v1::CompleteResponse response;
  ASSERT_TRUE(
      CompleteOne(scheduler, CompleteItemFor(x, shorter), &response).ok());
  ASSERT_TRUE(response.results(0).backup_attached());
  // The longer one runs past that node's tail: deferred.
  const v1::CompleteItem retry = CompleteItemFor(y, longer);
  ASSERT_TRUE(CompleteOne(scheduler, retry, &response).ok());
  ASSERT_TRUE(response.results(0).deferred());
  EXPECT_EQ(Stats().backups_rolled_back(), 0)
      << "the deferred item's backup was rolled back";
  // The blocking backup commits; the retry must go through.
  {
    BackupStream stream(stub_.get(), scheduler);
    for (uint32_t step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(stream.LayerStored({x.backup_id()}, step));
    }
    ASSERT_TRUE(stream.Close().ok());
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Stats().pending_backups() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(Stats().pending_backups(), 0);
  grpc::Status status = CompleteOne(scheduler, retry, &response);
  EXPECT_TRUE(status.ok()) << "the documented retry of a deferred Complete "
                              "is refused: "
                           << status.error_message();
  if (status.ok()) EXPECT_FALSE(response.results(0).deferred());
}

// The compute-owner pattern covers the input's new pages only; the output
// reserve takes any lanes (it used to be laid over input + reserve, so with
// a reserve ranks would have had to write KV into pages other ranks own).
TEST_F(StreamAbuseTest, AdmitZigzagCoversTheInputOnly) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  v1::AdmitRequest request;
  request.set_session_id(scheduler);
  v1::AdmitItem* item = request.add_items();
  item->set_tokens(Pack(Seq(0, 8 * kPage)));
  item->set_reserve_tokens(8 * kPage);
  item->set_mode(v1::COMPUTE_OWNER_MODE_ZIGZAG);
  item->set_backup(v1::BACKUP_CHOICE_NEVER);
  v1::AdmitResponse response;
  ASSERT_TRUE(Admit(request, &response).ok());
  const v1::AdmitResult& a = response.results(0);
  ASSERT_EQ(a.pages_size(), 16);
  std::vector<uint32_t> input_lanes;
  for (int i = 0; i < 8; ++i) input_lanes.push_back(a.pages(i) % kCp);
  // Without a reserve the same input gets exactly this split.
  EXPECT_EQ(input_lanes, (std::vector<uint32_t>{0, 0, 1, 1, 1, 1, 0, 0}))
      << "the input pages' lanes follow the zigzag of input + reserve";
}

}  // namespace
}  // namespace hicache::stream_abuse_testing
