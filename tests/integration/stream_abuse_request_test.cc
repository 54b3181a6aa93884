// Request calls with absurd or foreign arguments against a real hicached
// process (stream_abuse_support.h): LoadBack with too many items or an
// absurd extend_tokens; Admit with an absurd reserve_tokens; Complete naming
// another session's lock handle or pages, or one handle twice: refused,
// nothing changed.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/integration/stream_abuse_support.h"
#include "tests/testing/tokens.h"

namespace hicache::stream_abuse_testing {
namespace {

using ::testing::HasSubstr;
using testing::Pack;
using testing::Seq;

// --- LoadBack, Admit, Complete with absurd or foreign arguments --------------

TEST_F(StreamAbuseTest, LoadBackWithHugeItemsOrExtendIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  ASSERT_NO_FATAL_FAILURE(CacheOnHostOnly(scheduler, tokens));
  const Snapshot before = Snap();
  // Items past the limit.
  v1::LoadBackRequest many;
  many.set_session_id(scheduler);
  for (int i = 0; i <= kItemLimit; ++i)
    many.add_items()->set_tokens(Pack(tokens));
  LoadBackRun run = LoadBack(many);
  EXPECT_EQ(run.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(run.status.error_message(), HasSubstr(absl::StrCat(kItemLimit)));
  EXPECT_TRUE(run.events.empty());
  // An extend no request has, alone or in a batch, and a negative one.
  for (int64_t extend : {INT64_MAX, kTokenLimit + 1, int64_t{-1}, INT64_MIN}) {
    v1::LoadBackRequest one;
    one.set_session_id(scheduler);
    one.set_tokens(Pack(tokens));
    one.set_extend_tokens(extend);
    run = LoadBack(one);
    EXPECT_EQ(run.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << extend;
    EXPECT_THAT(run.status.error_message(),
                HasSubstr(absl::StrCat("extend_tokens must be in [0, ",
                                       kTokenLimit, "]")));
    EXPECT_TRUE(run.events.empty());
    v1::LoadBackRequest batch;
    batch.set_session_id(scheduler);
    batch.add_items()->set_tokens(Pack(tokens));
    v1::LoadItem* bad = batch.add_items();
    bad->set_tokens(Pack(tokens));
    bad->set_extend_tokens(extend);
    run = LoadBack(batch);
    EXPECT_EQ(run.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_TRUE(run.events.empty()) << "a refused batch started item 0";
  }
  EXPECT_EQ(Snap(), before);
  // The largest extend allowed, more than the pool: an over_quota miss that
  // leaves the host copy alone and locks only the (empty) device hit.
  v1::LoadBackRequest greedy;
  greedy.set_session_id(scheduler);
  greedy.set_tokens(Pack(tokens));
  greedy.set_extend_tokens(kTokenLimit);
  run = LoadBack(greedy);
  ASSERT_TRUE(run.status.ok()) << run.status.error_message();
  ASSERT_EQ(run.events.size(), 2u);
  ASSERT_TRUE(run.events[0].has_started());
  EXPECT_EQ(run.events[0].started().load_id(), 0u);
  EXPECT_EQ(run.events[0].started().miss_reason(), "over_quota");
  ASSERT_TRUE(run.events[1].has_done());
  EXPECT_TRUE(run.events[1].done().ok());
  EXPECT_EQ(run.events[1].done().load_id(), 0u);
  Snapshot after = Snap();
  EXPECT_EQ(after.loads_started, before.loads_started);
  EXPECT_EQ(after.host_tokens, before.host_tokens);
  EXPECT_EQ(after.allocated, before.allocated);
  if (run.events[0].started().lock_handle() != 0) {
    ASSERT_TRUE(
        Unlock(scheduler, {run.events[0].started().lock_handle()}).ok());
  }
  EXPECT_EQ(Snap(), before);
  // The copy is still loadable with a sane extend.
  v1::LoadBackRequest sane;
  sane.set_session_id(scheduler);
  sane.set_tokens(Pack(tokens));
  sane.set_extend_tokens(kPage);
  run = LoadBack(sane);
  ASSERT_TRUE(run.status.ok()) << run.status.error_message();
  ASSERT_FALSE(run.events.empty());
  ASSERT_TRUE(run.events.back().has_done());
  EXPECT_TRUE(run.events.back().done().ok());
  EXPECT_NE(run.events.front().started().load_id(), 0u);
  ASSERT_TRUE(Unlock(scheduler, {run.events.back().done().lock_handle()}).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST_F(StreamAbuseTest, AdmitWithHugeReserveIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::vector<int32_t> prefix = Seq(0, 2 * kPage);
  Cache(scheduler, prefix);  // A device hit the refused calls must not lock.
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  const Snapshot before = Snap();
  ASSERT_EQ(before.session_locks, 0);
  auto request = [&](std::vector<int64_t> reserves) {
    v1::AdmitRequest r;
    r.set_session_id(scheduler);
    for (int64_t reserve : reserves) {
      v1::AdmitItem* item = r.add_items();
      item->set_tokens(Pack(tokens));
      item->set_reserve_tokens(reserve);
      item->set_backup(v1::BACKUP_CHOICE_ALWAYS);
    }
    return r;
  };
  v1::AdmitResponse response;
  for (int64_t reserve : {INT64_MAX, kTokenLimit + 1, int64_t{-1}, INT64_MIN}) {
    grpc::Status status = Admit(request({0, reserve}), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << reserve;
    EXPECT_THAT(
        status.error_message(),
        HasSubstr(absl::StrCat("items[1].reserve_tokens must be in [0, ",
                               kTokenLimit, "]")));
  }
  // Allowed, but more than the whole pool: the call fails before any item
  // is matched (the first one would fit).
  grpc::Status status = Admit(request({0, kTokenLimit}), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("items[1]"));
  EXPECT_THAT(status.error_message(), HasSubstr("usable device pages"));
  // Items past the limit.
  status = Admit(request(std::vector<int64_t>(kItemLimit + 1, 0)), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(kItemLimit)));
  EXPECT_EQ(Snap(), before);
  // A sane request still goes through and returns everything.
  const v1::AdmitResult a = AdmitOne(scheduler, tokens, kPage);
  ASSERT_TRUE(a.admitted());
  EXPECT_EQ(a.device().valid_tokens(), 2 * kPage);
  ASSERT_TRUE(CompleteOne(scheduler, CompleteItemFor(a, tokens)).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
}

TEST_F(StreamAbuseTest,
       CompleteWithAnotherSessionsHandleOrPagesChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string a_id = Open(v1::ROLE_SCHEDULER);
  const std::string b_id = Open(v1::ROLE_SCHEDULER);
  Cache(a_id, Seq(0, 2 * kPage));
  const std::vector<int32_t> a_tokens = Seq(0, 4 * kPage);
  const std::vector<int32_t> b_tokens = Seq(100, 3 * kPage);
  const v1::AdmitResult a = AdmitOne(a_id, a_tokens, kPage);
  const v1::AdmitResult b = AdmitOne(b_id, b_tokens, kPage);
  ASSERT_NE(a.lock_handle(), 0u);
  ASSERT_EQ(a.pages_size(), 3);
  ASSERT_EQ(b.pages_size(), 4);
  const Snapshot before = Snap();
  ASSERT_EQ(before.session_locks, 1);
  const v1::CompleteItem b_good = CompleteItemFor(b, b_tokens);
  // B releases A's lock handle: NOT_FOUND, nothing changed.
  v1::CompleteItem steal = b_good;
  steal.add_lock_handles(a.lock_handle());
  grpc::Status status = CompleteOne(b_id, steal);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("not a lock of this session"));
  EXPECT_EQ(Snap(), before);
  // B caches A's tokens in A's pages.
  status = CompleteOne(b_id, CompleteItemFor(a, a_tokens));
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Snap(), before);
  v1::CompleteItem a_pages_only = CompleteItemFor(a, a_tokens);
  a_pages_only.clear_lock_handles();
  status = CompleteOne(b_id, a_pages_only);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("not held by this session"));
  EXPECT_EQ(Snap(), before);
  // B frees A's pages along with its own Complete.
  v1::CompleteItem free_theirs = b_good;
  free_theirs.add_free_pages(a.pages(2));
  status = CompleteOne(b_id, free_theirs);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("free_pages"));
  EXPECT_EQ(Snap(), before);
  // B attaches a backup it does not own.
  v1::CompleteItem foreign_backup = b_good;
  foreign_backup.set_backup_id(123456);
  status = CompleteOne(b_id, foreign_backup);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_EQ(Snap(), before);
  // A worker completes: PERMISSION_DENIED, before anything else.
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  status = CompleteOne(w0, CompleteItemFor(a, a_tokens));
  EXPECT_FALSE(status.ok());
  Snapshot with_worker = before;
  with_worker.sessions += 1;
  EXPECT_EQ(Snap(), with_worker);
  // Both still complete their own requests, and everything is returned.
  ASSERT_TRUE(CompleteOne(a_id, CompleteItemFor(a, a_tokens)).ok());
  ASSERT_TRUE(CompleteOne(b_id, b_good).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
}

TEST_F(StreamAbuseTest, RepeatedHandleOrPageIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  Cache(scheduler, Seq(0, 2 * kPage));
  const std::vector<int32_t> tokens = Seq(0, 3 * kPage);
  const v1::AdmitResult a = AdmitOne(scheduler, tokens, 2 * kPage);
  const uint64_t h = a.lock_handle();
  ASSERT_NE(h, 0u);
  const v1::CompleteItem good = CompleteItemFor(a, tokens);
  ASSERT_EQ(good.free_pages_size(), 2);
  const Snapshot before = Snap();
  // One handle twice in one item.
  v1::CompleteItem twice = good;
  twice.add_lock_handles(h);
  grpc::Status status = CompleteOne(scheduler, twice);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("repeated"));
  EXPECT_EQ(Snap(), before);
  // One handle in two items of one call.
  v1::CompleteRequest two;
  two.set_session_id(scheduler);
  *two.add_items() = good;
  v1::CompleteItem other = good;
  other.clear_pages();
  other.clear_free_pages();
  other.set_backup_id(0);
  other.set_free_uncached(false);
  other.set_tokens(Pack(Seq(500, kPage)));
  other.add_pages(a.pages(1));
  *two.add_items() = other;
  v1::CompleteResponse response;
  status = Complete(two, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("repeated"));
  EXPECT_EQ(Snap(), before);
  // One page to free twice.
  v1::CompleteItem free_twice = good;
  free_twice.add_free_pages(good.free_pages(0));
  status = CompleteOne(scheduler, free_twice);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Snap(), before);
  // A page both cached and freed.
  v1::CompleteItem both = good;
  both.add_free_pages(good.pages(good.pages_size() - 1));
  status = CompleteOne(scheduler, both);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Snap(), before);
  // Unlock with the handle twice.
  status = Unlock(scheduler, {h, h});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("repeated"));
  EXPECT_EQ(Snap(), before);
  // The real Complete, then the same handle again: released already.
  ASSERT_TRUE(CompleteOne(scheduler, good).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
  const Snapshot done = Snap();
  status = Unlock(scheduler, {h});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Snap(), done);
}

}  // namespace
}  // namespace hicache::stream_abuse_testing
