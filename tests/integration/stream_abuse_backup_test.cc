// BackupSession streams abused against a real hicached process
// (stream_abuse_support.h): layer_stored with 100000 fences (repeated ranks,
// unknown ids), with 100000 backup ids, with a step past the last: refused,
// nothing copied; a worker's stream going away mid-backup rolls back nothing
// of the scheduler's; a stream naming another session's id ends, and its
// backup is rolled back.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/integration/stream_abuse_support.h"

namespace hicache::stream_abuse_testing {
namespace {

using ::testing::HasSubstr;

// --- layer_stored with absurd lists ------------------------------------------

TEST_F(StreamAbuseTest, LayerStoredWithHugeFenceListIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::vector<int64_t> pages = Allocate(scheduler, 2);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.mutable_pages()->Add(pages.begin(), pages.end());
  spec.set_logical_tokens(2 * kPage);
  const std::vector<uint64_t> ids = stream.Prepare({spec});
  ASSERT_EQ(ids.size(), 1u);
  const uint64_t backup = ids[0];
  ASSERT_NE(backup, 0u);
  const Snapshot before = Snap();
  // 100000 fences: every rank many times over, ids nobody registered.
  v1::BackupClientMessage huge;
  huge.mutable_layer_stored()->add_backup_ids(backup);
  huge.mutable_layer_stored()->set_step(0);
  for (int i = 0; i < 100000; ++i) {
    v1::RankFence* fence = huge.mutable_layer_stored()->add_fences();
    fence->set_rank(i % 3);  // Rank 2 is no rank at C = 2.
    fence->set_fence_id(1000 + i % 7);
  }
  ASSERT_TRUE(stream.Send(huge));
  std::optional<v1::BackupServerMessage::Error> error = stream.WaitError(0);
  ASSERT_TRUE(error.has_value()) << "no error for 100000 fences";
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("100000 fences"));
  EXPECT_THAT(error->message(), HasSubstr(absl::StrCat(kCp, " ranks")));
  // As many fences as ranks, but repeated ranks and unknown ids.
  v1::BackupClientMessage repeated;
  repeated.mutable_layer_stored()->add_backup_ids(backup);
  for (uint32_t i = 0; i < kCp; ++i) {
    v1::RankFence* fence = repeated.mutable_layer_stored()->add_fences();
    fence->set_rank(0);
    fence->set_fence_id(77);
  }
  ASSERT_TRUE(stream.Send(repeated));
  error = stream.WaitError(1);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::NOT_FOUND))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("fences[0] = 77"));
  // The same from the worker of rank 0, on its own stream.
  BackupStream worker(stub_.get(), w0);
  ASSERT_TRUE(worker.Send(huge));
  error = worker.WaitError(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("100000 fences"));
  // Nothing was submitted: no step_done, no byte copied.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(stream.StepsDone(backup), 0);
  EXPECT_EQ(Snap(), before);
  // Both streams still work: the backup stores and commits normally.
  EXPECT_FALSE(stream.ended());
  EXPECT_FALSE(worker.ended());
  for (uint32_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(stream.LayerStored({backup}, step));
  }
  EXPECT_TRUE(stream.WaitFor([&](const auto& messages) {
    return BackupStream::StepsDone(messages, backup) == kCp * kSteps;
  }));
  EXPECT_EQ(stream.Errors().size(), 2u);
  EXPECT_EQ(worker.Errors().size(), 1u);
  EXPECT_TRUE(worker.Close().ok());
  EXPECT_TRUE(stream.Close().ok());  // Unattached: rolled back at the close.
  EXPECT_EQ(Stats().pending_backups(), 0);
}

TEST_F(StreamAbuseTest, LayerStoredWithHugeBackupIdListIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  const std::vector<int64_t> pages = Allocate(scheduler, 1);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.add_pages(pages[0]);
  spec.set_logical_tokens(kPage);
  const std::vector<uint64_t> ids = stream.Prepare({spec});
  ASSERT_EQ(ids.size(), 1u);
  const uint64_t backup = ids[0];
  const Snapshot before = Snap();
  // 100000 ids: the real backup among repeats and ids that do not exist.
  std::vector<uint64_t> many;
  for (int i = 0; i < 100000; ++i) {
    many.push_back(i % 2 == 0 ? backup : 1000000 + i);
  }
  ASSERT_TRUE(stream.LayerStored(many, 0));
  std::optional<v1::BackupServerMessage::Error> error = stream.WaitError(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("100000 entries"));
  EXPECT_THAT(error->message(), HasSubstr(absl::StrCat(kItemLimit)));
  // Just past the limit, from a worker.
  BackupStream worker(stub_.get(), w1);
  ASSERT_TRUE(
      worker.LayerStored(std::vector<uint64_t>(kItemLimit + 1, backup), 0));
  error = worker.WaitError(0);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr(absl::StrCat(kItemLimit)));
  // Within the limit, one unknown id refuses the whole message.
  ASSERT_TRUE(stream.LayerStored({backup, 999999999}, 0));
  error = stream.WaitError(1);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("999999999"));
  // A step past the last.
  ASSERT_TRUE(stream.LayerStored({backup}, UINT32_MAX));
  error = stream.WaitError(2);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("step"));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(stream.StepsDone(backup), 0) << "a refused layer_stored copied";
  EXPECT_EQ(Snap(), before);
  // Its own id repeated (within the limit) is refused too, naming it.
  ASSERT_TRUE(stream.LayerStored({backup, backup, backup}, 0));
  error = stream.WaitError(3);
  ASSERT_TRUE(error.has_value());
  EXPECT_EQ(error->code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT))
      << error->message();
  EXPECT_THAT(error->message(), HasSubstr("named twice"));
  // The backup is intact: stored once per step.
  for (uint32_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(stream.LayerStored({backup}, step));
  }
  EXPECT_TRUE(stream.WaitFor([&](const auto& messages) {
    return BackupStream::StepsDone(messages, backup) == kCp * kSteps;
  }));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(stream.StepsDone(backup), kCp * kSteps);
  EXPECT_TRUE(worker.Close().ok());
  EXPECT_TRUE(stream.Close().ok());
}

// A worker's BackupSession only acks; closing it (half-close or cancel) in
// the middle of a backup rolls back nothing of the scheduler's.
TEST_F(StreamAbuseTest, WorkerBackupStreamGoingAwayRollsBackNothing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  const std::vector<int64_t> pages = Allocate(scheduler, 2);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.mutable_pages()->Add(pages.begin(), pages.end());
  spec.set_logical_tokens(2 * kPage);
  const std::vector<uint64_t> ids = stream.Prepare({spec});
  ASSERT_EQ(ids.size(), 1u);
  const uint64_t backup = ids[0];
  {
    BackupStream half(stub_.get(), w0);  // Acks step 0, then half-closes.
    ASSERT_TRUE(half.LayerStored({backup}, 0));
    EXPECT_TRUE(half.Close().ok());
    EXPECT_TRUE(half.Errors().empty());
  }
  {
    BackupStream dropped(stub_.get(), w1);  // Acks step 0, then cancels.
    ASSERT_TRUE(dropped.LayerStored({backup}, 0));
    ASSERT_TRUE(stream.WaitFor([&](const auto& messages) {
      return BackupStream::StepsDone(messages, backup) == kCp;
    }));
  }  // ~BackupStream cancels.
  // The scheduler stores the last step for every rank; the backup is whole.
  ASSERT_TRUE(stream.LayerStored({backup}, kSteps - 1));
  EXPECT_TRUE(stream.WaitFor([&](const auto& messages) {
    return BackupStream::StepsDone(messages, backup) == kCp * kSteps;
  }));
  EXPECT_EQ(stream.Count(&v1::BackupServerMessage::has_rolled_back), 0u);
  EXPECT_EQ(Stats().backups_rolled_back(), 0);
  EXPECT_TRUE(stream.Errors().empty());
  EXPECT_TRUE(stream.Close().ok());  // Unattached: rolled back now.
  EXPECT_EQ(Stats().backups_rolled_back(), 1);
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w1));
}

TEST_F(StreamAbuseTest, BackupStreamWithAnotherSessionIdEndsAndRollsBack) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string other = Open(v1::ROLE_SCHEDULER);
  const std::vector<int64_t> pages = Allocate(scheduler, 1);
  BackupStream stream(stub_.get(), scheduler);
  v1::BackupSpec spec;
  spec.add_pages(pages[0]);
  spec.set_logical_tokens(kPage);
  ASSERT_EQ(stream.Prepare({spec}).size(), 1u);
  ASSERT_EQ(Stats().pending_backups(), 0);  // Not attached: not in the tree.
  v1::BackupClientMessage hijack;
  hijack.set_session_id(other);
  hijack.mutable_rollback()->set_backup_id(1);
  ASSERT_TRUE(stream.Send(hijack));
  const grpc::Status status = stream.Close();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("session_id"));
  // The stream's backup was rolled back; the pages stay the session's.
  const v1::CacheStats stats = Stats();
  EXPECT_EQ(stats.backups_rolled_back(), 1);
  EXPECT_EQ(stats.session_pages(), 1);
  // A first message without a session id: refused, no slot taken.
  BackupStream anonymous(stub_.get(), "");
  v1::BackupClientMessage nameless;
  nameless.mutable_store_all()->set_backup_id(1);
  {
    // Send() fills in the stream's session id; this one has none.
    ASSERT_TRUE(anonymous.Send(nameless));
  }
  EXPECT_EQ(anonymous.Close().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace hicache::stream_abuse_testing
