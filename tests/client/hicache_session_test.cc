// client::Session (v1.1) against a real DaemonServer on a real unix socket:
// every call of the client, its results and its error paths.
#include "client/cpp/hicache_session.h"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "daemon/core/clock.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::Seq;

constexpr uint32_t kPageSize = 4;

std::shared_ptr<v1::HiCache::Stub> StubFor(const std::string& socket) {
  return v1::HiCache::NewStub(grpc::CreateChannel(
      client::UnixTarget(socket), grpc::InsecureChannelCredentials()));
}

DaemonConfig SmallConfig() {
  DaemonConfig config;
  config.page_size = kPageSize;
  config.cp_size = 2;
  config.device_pages_per_rank = 8;
  config.host_pages_per_rank = 16;
  config.operator_uids = {static_cast<uint32_t>(getuid())};
  return config;
}

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = DaemonServer::Start(SmallConfig(), socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = StubFor(socket_);
    session_ = Open();
    ASSERT_NE(session_, nullptr);
    auto layout = session_->GetLayout();
    ASSERT_TRUE(layout.ok()) << layout.status();
    num_steps_ = layout->num_steps();
    ASSERT_GT(num_steps_, 0u);
  }

  std::unique_ptr<client::Session> Open(v1::Role role = v1::ROLE_SCHEDULER,
                                        uint32_t rank = 0,
                                        const std::string& ns = "") {
    auto session = client::Session::Open(stub_, "session-test", role, rank, ns);
    EXPECT_TRUE(session.ok()) << session.status();
    return session.ok() ? *std::move(session) : nullptr;
  }

  std::vector<int64_t> AllocatePages(int num_pages) {
    v1::AllocateItem item;
    item.set_num_pages(num_pages);
    auto allocation = session_->Allocate({item});
    EXPECT_TRUE(allocation.ok()) << allocation.status();
    if (!allocation.ok()) return {};
    const auto& pages = allocation->allocations(0).pages();
    return std::vector<int64_t>(pages.begin(), pages.end());
  }

  // Caches `tokens` on the device (allocate, insert); returns the node.
  uint64_t Cache(const std::vector<int32_t>& tokens) {
    const std::vector<int64_t> pages = AllocatePages(tokens.size() / kPageSize);
    v1::InsertRequest insert;
    v1::InsertItem* item = insert.add_items();
    item->set_tokens(client::PackTokens(tokens));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    auto inserted = session_->Insert(insert);
    EXPECT_TRUE(inserted.ok()) << inserted.status();
    return inserted.ok() ? inserted->results(0).node() : 0;
  }

  // Caches `tokens` on device and host (a committed backup), then evicts
  // the device copy: a host-only hit.
  void CacheOnHostOnly(const std::vector<int32_t>& tokens) {
    const std::vector<int64_t> pages = AllocatePages(tokens.size() / kPageSize);
    auto stream = session_->OpenBackupStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    v1::BackupSpec spec;
    spec.mutable_pages()->Add(pages.begin(), pages.end());
    spec.set_logical_tokens(tokens.size());
    auto ids = (*stream)->Prepare({spec});
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_NE(ids->at(0), 0u);
    ASSERT_TRUE((*stream)->StoreAll(ids->at(0)).ok());
    v1::InsertRequest insert;
    v1::InsertItem* item = insert.add_items();
    item->set_tokens(client::PackTokens(tokens));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(ids->at(0));
    auto inserted = session_->Insert(insert);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    ASSERT_TRUE(inserted->results(0).backup_attached());
    auto node = (*stream)->WaitCommitted(ids->at(0));
    ASSERT_TRUE(node.ok()) << node.status();
    EXPECT_EQ(*node, inserted->results(0).node());
    ASSERT_TRUE((*stream)->Close().ok());
    EvictDevice();
  }

  void EvictDevice() {
    grpc::ClientContext ctx;
    v1::EvictRequest request;
    request.add_device_pages_per_lane(8);
    request.add_device_pages_per_lane(8);
    v1::EvictResponse response;
    ASSERT_TRUE(stub_->Evict(&ctx, request, &response).ok());
  }

  v1::CacheStats Stats() {
    grpc::ClientContext ctx;
    v1::CacheStats stats;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats;
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server_;
  std::shared_ptr<v1::HiCache::Stub> stub_;
  std::unique_ptr<client::Session> session_;
  uint32_t num_steps_ = 0;
};

TEST(SessionOpenTest, FailsFastWithoutADaemonAndWaitsWhenAsked) {
  testing::TempDir dir;
  const std::string socket = dir.Child("late.sock");
  auto stub = StubFor(socket);
  auto refused = client::Session::Open(stub, "early", v1::ROLE_SCHEDULER, 0,
                                       "", absl::Seconds(10));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable)
      << refused.status();
  // A daemon that comes up 300 ms later: Open with wait_for_daemon waits.
  FakeClock clock{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server;
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(300));
    auto started = DaemonServer::Start(SmallConfig(), socket, &clock);
    ASSERT_TRUE(started.ok()) << started.status();
    server = *std::move(started);
  });
  auto session =
      client::Session::Open(stub, "patient", v1::ROLE_SCHEDULER, 0, "",
                            absl::Seconds(10), absl::Seconds(20));
  late.join();
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_FALSE((*session)->id().empty());
  EXPECT_TRUE((*session)->Close().ok());
}

TEST_F(SessionTest, MatchPrefixWithLockReturnsOneHandlePerHit) {
  const uint64_t node = Cache(Seq(0, 8));
  auto first = session_->MatchPrefix({Seq(0, 8), Seq(500, 8)}, {.lock = true});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->results_size(), 2);
  EXPECT_EQ(first->results(0).device().valid_tokens(), 8);
  EXPECT_EQ(first->results(0).last_device_node(), node);
  EXPECT_NE(first->results(0).lock_handle(), 0u);
  EXPECT_EQ(first->results(1).device().valid_tokens(), 0);
  auto second = session_->MatchPrefix({Seq(0, 8)}, {.lock = true});
  ASSERT_TRUE(second.ok());
  const std::vector<uint64_t> a = client::Session::LockHandles(*first);
  const std::vector<uint64_t> b = client::Session::LockHandles(*second);
  ASSERT_EQ(b.size(), 1u);
  ASSERT_GE(a.size(), 1u);
  EXPECT_NE(a[0], b[0]);
  EXPECT_EQ(Stats().session_locks(), static_cast<int64_t>(a.size() + 1));
  // Releasing one request's lock leaves the other's.
  ASSERT_TRUE(session_->UnlockHandles(a).ok());
  EXPECT_EQ(Stats().session_locks(), 1);
  // A released handle, a repeated one, an unknown one: errors, nothing
  // released.
  absl::Status again = session_->UnlockHandles(a);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_THAT(again.message(), HasSubstr("Unlock: "));
  EXPECT_EQ(session_->UnlockHandles({b[0], b[0]}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(session_->UnlockHandles({987654321}).ok());
  EXPECT_EQ(Stats().session_locks(), 1);
  ASSERT_TRUE(session_->UnlockHandles(b).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST_F(SessionTest, MatchWithoutLockAndPeekHoldNothing) {
  Cache(Seq(0, 8));
  auto plain = session_->Match({Seq(0, 8)}, /*lock=*/false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->results(0).device().valid_tokens(), 8);
  EXPECT_EQ(plain->results(0).lock_handle(), 0u);
  const int64_t calls = Stats().match_calls();
  auto peek = session_->MatchPrefix({Seq(0, 8)}, {.peek = true});
  ASSERT_TRUE(peek.ok());
  EXPECT_EQ(peek->results(0).device().valid_tokens(), 8);
  EXPECT_EQ(Stats().match_calls(), calls);  // Peeks are not counted.
  EXPECT_TRUE(client::Session::LockHandles(*peek).empty());
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST_F(SessionTest, LockByNodesReturnsHandlesAndV10UnlockStillWorks) {
  const uint64_t node = Cache(Seq(0, 8));
  auto handles = session_->Lock({node, node});
  ASSERT_TRUE(handles.ok()) << handles.status();
  ASSERT_EQ(handles->size(), 2u);
  EXPECT_NE(handles->at(0), handles->at(1));
  EXPECT_EQ(Stats().session_locks(), 2);
  ASSERT_TRUE(session_->Unlock({node}).ok());  // One lock per listed node.
  EXPECT_EQ(Stats().session_locks(), 1);
  ASSERT_TRUE(session_->Unlock({node}).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_FALSE(session_->Unlock({node}).ok());  // Not locked any more.
  auto unknown = session_->Lock({424242});
  EXPECT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("Lock: "));
  // Another session cannot release this one's handles.
  auto mine = session_->Lock({node});
  ASSERT_TRUE(mine.ok());
  std::unique_ptr<client::Session> other = Open();
  EXPECT_EQ(other->UnlockHandles(*mine).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(session_->UnlockHandles(*mine).ok());
}

TEST_F(SessionTest, FreeReturnsPagesAndRefusesForeignOnes) {
  const std::vector<int64_t> pages = AllocatePages(3);
  ASSERT_EQ(pages.size(), 3u);
  EXPECT_EQ(Stats().session_pages(), 3);
  ASSERT_TRUE(session_->Free({pages[0], pages[1]}).ok());
  EXPECT_EQ(Stats().session_pages(), 1);
  absl::Status again = session_->Free({pages[0]});
  EXPECT_FALSE(again.ok());
  EXPECT_THAT(again.message(), HasSubstr("Free: "));
  std::unique_ptr<client::Session> other = Open();
  EXPECT_FALSE(other->Free({pages[2]}).ok());
  EXPECT_TRUE(session_->Free({pages[2]}).ok());
  EXPECT_EQ(Stats().session_pages(), 0);
}

TEST_F(SessionTest, LoadBackWithNothingToLoadEndsWithDone) {
  Cache(Seq(0, 8));
  auto hit = session_->LoadBack(Seq(0, 12), /*extend_tokens=*/4);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_TRUE(hit->ok());
  EXPECT_EQ(hit->load_id(), 0u);
  EXPECT_EQ(hit->started.device_tokens(), 8);
  EXPECT_EQ(hit->layers_loaded, 0);
  ASSERT_NE(hit->lock_handle(), 0u);  // The device hit's lock.
  ASSERT_TRUE(session_->UnlockHandles({hit->lock_handle()}).ok());
  auto miss = session_->LoadBack(Seq(900, 8));
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->started.device_tokens() + miss->started.loaded_tokens(), 0);
  if (miss->lock_handle() != 0) {
    ASSERT_TRUE(session_->UnlockHandles({miss->lock_handle()}).ok());
  }
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST_F(SessionTest, BatchedLoadBackReadsEveryItemToItsDone) {
  ASSERT_NO_FATAL_FAILURE(CacheOnHostOnly(Seq(100, 8)));
  Cache(Seq(0, 8));
  auto results = session_->LoadBack(std::vector<client::LoadItem>{
      {Seq(500, 8), 0}, {Seq(0, 8), 0}, {Seq(100, 8), 4}});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  const client::LoadResult& miss = (*results)[0];
  const client::LoadResult& device = (*results)[1];
  const client::LoadResult& loaded = (*results)[2];
  EXPECT_EQ(miss.load_id(), 0u);
  EXPECT_EQ(device.load_id(), 0u);
  EXPECT_EQ(device.started.device_tokens(), 8);
  ASSERT_NE(loaded.load_id(), 0u) << loaded.started.ShortDebugString();
  EXPECT_EQ(loaded.started.loaded_tokens(), 8);
  EXPECT_EQ(loaded.layers_loaded, static_cast<int>(2 * num_steps_));
  EXPECT_EQ(loaded.done.load_id(), loaded.load_id());
  std::vector<uint64_t> handles;
  for (const client::LoadResult& r : *results) {
    EXPECT_TRUE(r.ok());
    if (r.lock_handle() != 0) handles.push_back(r.lock_handle());
  }
  EXPECT_NE(loaded.lock_handle(), 0u);
  EXPECT_EQ(Stats().session_locks(), static_cast<int64_t>(handles.size()));
  ASSERT_TRUE(session_->UnlockHandles(handles).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
  // The loaded tokens are a device hit now.
  auto match = session_->Match({Seq(100, 8)}, false);
  ASSERT_TRUE(match.ok());
  EXPECT_EQ(match->results(0).device().valid_tokens(), 8);
}

TEST_F(SessionTest, LoadBackStreamErrorsAreStatuses) {
  // One request or a batch, not both: the stream's INVALID_ARGUMENT.
  v1::LoadBackRequest both;
  both.set_tokens(testing::Pack(Seq(0, 4)));
  both.add_items()->set_tokens(testing::Pack(Seq(0, 4)));
  auto stream = session_->StartLoadBack(both);
  ASSERT_TRUE(stream.ok());
  v1::LoadBackEvent event;
  EXPECT_FALSE((*stream)->Next(&event));
  absl::Status finished = (*stream)->Finish();
  EXPECT_EQ(finished.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(finished.message(), HasSubstr("LoadBack: "));
  // A closed session's load is refused.
  std::unique_ptr<client::Session> closed = Open();
  ASSERT_TRUE(closed->Close().ok());
  EXPECT_FALSE(closed->LoadBack(Seq(0, 4)).ok());
  EXPECT_FALSE(
      closed->LoadBack(std::vector<client::LoadItem>{{Seq(0, 4), 0}}).ok());
  auto empty = session_->LoadBack(std::vector<client::LoadItem>{});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST_F(SessionTest, FinishLoadAbandonsOrRefuses) {
  EXPECT_FALSE(session_->FinishLoad(123456).ok());
  ASSERT_NO_FATAL_FAILURE(CacheOnHostOnly(Seq(0, 16)));
  v1::LoadBackRequest request;
  request.set_tokens(testing::Pack(Seq(0, 16)));
  auto stream = session_->StartLoadBack(request);
  ASSERT_TRUE(stream.ok());
  v1::LoadBackEvent event;
  ASSERT_TRUE((*stream)->Next(&event));
  ASSERT_TRUE(event.has_started());
  const uint64_t load_id = event.started().load_id();
  ASSERT_NE(load_id, 0u) << event.ShortDebugString();
  std::unique_ptr<client::Session> other = Open();
  EXPECT_FALSE(other->FinishLoad(load_id).ok());  // Not its load.
  // Either abandoned now, or (tiny copies) already handed over.
  const absl::Status finished = session_->FinishLoad(load_id);
  bool got_done = false;
  while ((*stream)->Next(&event)) {
    if (!event.has_done()) continue;
    got_done = true;
    EXPECT_EQ(event.done().ok(), event.done().lock_handle() != 0);
    if (finished.ok()) {
      EXPECT_EQ(Stats().session_locks(), 0);
    }
    if (event.done().lock_handle() != 0) {
      EXPECT_TRUE(session_->UnlockHandles({event.done().lock_handle()}).ok());
    }
  }
  EXPECT_TRUE(got_done);
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_FALSE(session_->FinishLoad(load_id).ok());  // No longer a load.
}

TEST_F(SessionTest, FencesNeedTheCudaBackend) {
  std::unique_ptr<client::Session> worker = Open(v1::ROLE_WORKER, 0);
  auto fence = worker->RegisterFence(0, std::string(64, '\0'));
  ASSERT_FALSE(fence.ok());
  EXPECT_EQ(fence.status().code(), absl::StatusCode::kFailedPrecondition)
      << fence.status();
  EXPECT_THAT(fence.status().message(), HasSubstr("RegisterFence: "));
  absl::Status released = worker->ReleaseFence(77);
  EXPECT_FALSE(released.ok());
  EXPECT_THAT(released.message(), HasSubstr("ReleaseFence: "));
}

TEST_F(SessionTest, BackupStreamPreparesStoresAndCommits) {
  const std::vector<int64_t> pages = AllocatePages(2);
  auto stream = session_->OpenBackupStream();
  ASSERT_TRUE(stream.ok());
  v1::BackupSpec spec;
  spec.mutable_pages()->Add(pages.begin(), pages.end());
  spec.set_logical_tokens(8);
  auto ids = (*stream)->Prepare({spec});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_EQ(ids->size(), 1u);
  const uint64_t backup = ids->at(0);
  ASSERT_NE(backup, 0u);
  // Step 0, then read its step_done from both ranks.
  ASSERT_TRUE((*stream)->LayerStored({backup}, 0).ok());
  ASSERT_TRUE((*stream)->WaitSteps(backup, 2).ok());
  EXPECT_EQ((*stream)->Progress(backup).steps_done, 2);
  for (int i = 0; i < 2; ++i) {  // Kept for Next().
    auto message = (*stream)->Next();
    ASSERT_TRUE(message.ok()) << message.status();
    ASSERT_TRUE(message->has_step_done()) << message->ShortDebugString();
    EXPECT_EQ(message->step_done().step(), 0u);
  }
  for (uint32_t step = 1; step < num_steps_; ++step) {
    ASSERT_TRUE((*stream)->LayerStored({backup}, step).ok());
  }
  v1::InsertRequest insert;
  v1::InsertItem* item = insert.add_items();
  item->set_tokens(client::PackTokens(Seq(0, 8)));
  item->mutable_pages()->Add(pages.begin(), pages.end());
  item->set_backup_id(backup);
  auto inserted = session_->Insert(insert);
  ASSERT_TRUE(inserted.ok());
  ASSERT_TRUE(inserted->results(0).backup_attached());
  auto node = (*stream)->WaitCommitted(backup);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(*node, inserted->results(0).node());
  const client::BackupProgress progress = (*stream)->Progress(backup);
  EXPECT_TRUE(progress.committed);
  EXPECT_EQ(progress.steps_done, static_cast<int>(2 * num_steps_));
  (*stream)->ForgetEnded();
  EXPECT_EQ((*stream)->Progress(backup).steps_done, 0);
  EXPECT_TRUE((*stream)->TakeErrors().empty());
  EXPECT_TRUE((*stream)->Close().ok());
  EXPECT_TRUE((*stream)->Close().ok());  // Idempotent.
  EXPECT_FALSE((*stream)->LayerStored({backup}, 0).ok());  // Closed.
}

TEST_F(SessionTest, BackupStreamErrorsAndRollback) {
  auto stream = session_->OpenBackupStream();
  ASSERT_TRUE(stream.ok());
  // A page this session does not hold: the prepare's error.
  v1::BackupSpec foreign;
  foreign.add_pages(5);
  foreign.set_logical_tokens(4);
  auto refused = (*stream)->Prepare({foreign});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("prepare"));
  // An unknown backup id: an error message, and the stream goes on.
  ASSERT_TRUE((*stream)->LayerStored({99999}, 0).ok());
  auto error = (*stream)->Next();
  ASSERT_TRUE(error.ok()) << error.status();
  EXPECT_TRUE(error->has_error()) << error->ShortDebugString();
  // Prepare, then roll back: WaitCommitted says ABORTED.
  const std::vector<int64_t> pages = AllocatePages(1);
  v1::BackupSpec spec;
  spec.mutable_pages()->Add(pages.begin(), pages.end());
  spec.set_logical_tokens(4);
  auto ids = (*stream)->Prepare({spec});
  ASSERT_TRUE(ids.ok()) << ids.status();
  ASSERT_NE(ids->at(0), 0u);
  ASSERT_TRUE((*stream)->Rollback(ids->at(0)).ok());
  auto node = (*stream)->WaitCommitted(ids->at(0));
  EXPECT_EQ(node.status().code(), absl::StatusCode::kAborted) << node.status();
  EXPECT_TRUE((*stream)->Progress(ids->at(0)).rolled_back);
  // Errors read by helpers land in TakeErrors().
  ASSERT_TRUE((*stream)->Rollback(ids->at(0)).ok());
  EXPECT_TRUE((*stream)->Close().ok());
  const auto errors = (*stream)->TakeErrors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].code(), 0);
  // After the end, Next() says so.
  while (true) {
    auto next = (*stream)->Next();
    if (!next.ok()) {
      EXPECT_EQ(next.status().code(), absl::StatusCode::kOutOfRange);
      break;
    }
  }
}

TEST_F(SessionTest, DestroyingAnOpenBackupStreamRollsItsBackupsBack) {
  const std::vector<int64_t> pages = AllocatePages(1);
  {
    auto stream = session_->OpenBackupStream();
    ASSERT_TRUE(stream.ok());
    v1::BackupSpec spec;
    spec.mutable_pages()->Add(pages.begin(), pages.end());
    spec.set_logical_tokens(4);
    ASSERT_TRUE((*stream)->Prepare({spec}).ok());
    EXPECT_EQ(Stats().backups_started(), 1);
  }
  int64_t rolled_back = 0;
  // The rollback runs on the daemon's threads: a generous bound (a busy
  // machine may take long), never a timing assumption.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       rolled_back == 0 && absl::Now() < deadline;) {
    rolled_back = Stats().backups_rolled_back();
    if (rolled_back == 0) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(rolled_back, 1);
}

// Workers ack their own ranks over their own streams; each hears its events
// through Subscribe.
TEST_F(SessionTest, WorkersStoreTheirRanksAndSubscribe) {
  std::vector<std::unique_ptr<client::Session>> workers;
  std::vector<std::unique_ptr<client::WorkerEvents>> events;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    workers.push_back(Open(v1::ROLE_WORKER, rank));
    auto subscribed = workers.back()->Subscribe();
    ASSERT_TRUE(subscribed.ok()) << subscribed.status();
    events.push_back(*std::move(subscribed));
  }
  // A scheduler has no rank to subscribe to.
  auto refused = session_->Subscribe();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("Subscribe: "));

  v1::AllocateItem item;
  item.add_owners(0);
  item.add_owners(1);
  auto allocation = session_->Allocate({item});
  ASSERT_TRUE(allocation.ok());
  const auto& pages = allocation->allocations(0).pages();
  auto scheduler = session_->OpenBackupStream();
  ASSERT_TRUE(scheduler.ok());
  v1::BackupSpec spec;
  *spec.mutable_pages() = pages;
  spec.set_logical_tokens(8);
  auto ids = (*scheduler)->Prepare({spec});
  ASSERT_TRUE(ids.ok());
  const uint64_t backup = ids->at(0);
  // A worker of another namespace may not store it: an error on its stream.
  std::unique_ptr<client::Session> stranger =
      Open(v1::ROLE_WORKER, 0, "other-tenant");
  auto strange = stranger->OpenBackupStream();
  ASSERT_TRUE(strange.ok());
  ASSERT_TRUE((*strange)->LayerStored({backup}, 0).ok());
  EXPECT_TRUE((*strange)->Close().ok());
  EXPECT_EQ((*strange)->TakeErrors().size(), 1u);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    auto stream = workers[rank]->OpenBackupStream();
    ASSERT_TRUE(stream.ok());
    for (uint32_t step = 0; step < num_steps_; ++step) {
      ASSERT_TRUE((*stream)->LayerStored({backup}, step).ok());
    }
    EXPECT_TRUE((*stream)->Close().ok());
    EXPECT_TRUE((*stream)->TakeErrors().empty());
  }
  v1::InsertRequest insert;
  v1::InsertItem* insert_item = insert.add_items();
  insert_item->set_tokens(client::PackTokens(Seq(0, 8)));
  *insert_item->mutable_pages() = pages;
  insert_item->set_backup_id(backup);
  ASSERT_TRUE(session_->Insert(insert).ok());
  ASSERT_TRUE((*scheduler)->WaitCommitted(backup).ok());
  EXPECT_EQ((*scheduler)->Progress(backup).steps_done,
            static_cast<int>(2 * num_steps_));
  ASSERT_TRUE((*scheduler)->Close().ok());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    std::vector<uint32_t> steps;
    v1::WorkerEvent event;
    bool ended = false;
    while (!ended && events[rank]->Next(&event)) {
      EXPECT_EQ(event.rank(), rank);
      if (event.has_backup_step()) steps.push_back(event.backup_step().step());
      if (event.has_backup_ended()) {
        EXPECT_TRUE(event.backup_ended().committed());
        ended = true;
      }
    }
    EXPECT_TRUE(ended) << rank;
    std::sort(steps.begin(), steps.end());
    EXPECT_EQ(steps.size(), num_steps_);
    events[rank]->Cancel();
    while (events[rank]->Next(&event)) {
    }
    (void)events[rank]->Finish();
  }
}

// Acks every layer of `backup` on each rank's own worker stream, as the
// workers of a forward pass would.
void StoreOnWorkers(
    const std::vector<std::unique_ptr<client::Session>>& workers,
    uint64_t backup, uint32_t num_steps) {
  for (const auto& worker : workers) {
    auto stream = worker->OpenBackupStream();
    ASSERT_TRUE(stream.ok());
    for (uint32_t step = 0; step < num_steps; ++step) {
      ASSERT_TRUE((*stream)->LayerStored({backup}, step).ok());
    }
    EXPECT_TRUE((*stream)->Close().ok());
    EXPECT_TRUE((*stream)->TakeErrors().empty());
  }
}

// Waits until the daemon has committed `n` backups in all.
void AwaitCommitted(const std::function<v1::CacheStats()>& stats, int64_t n) {
  int64_t committed = 0;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       committed < n && absl::Now() < deadline;) {
    committed = stats().backups_committed();
    if (committed < n) absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(committed, n);
}

// A middle chunk of a chunked prefill, through the service: its backup
// covers only its whole pages and attaches to what its unfinished Complete
// keeps (the last partial page is the next chunk's).
TEST_F(SessionTest, MiddleChunkBackupAttachesOverTheWire) {
  const std::vector<int32_t> chunk = Seq(5000, 2 * kPageSize + 1);
  auto admitted = session_->Admit({client::MakeAdmitItem(
      chunk, 0, v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::BACKUP_CHOICE_ALWAYS,
      /*unfinished=*/true)});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const v1::AdmitResult& a = admitted->results(0);
  ASSERT_TRUE(a.admitted());
  ASSERT_NE(a.backup_id(), 0u);
  auto stream = session_->OpenBackupStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->StoreAll(a.backup_id()).ok());
  auto completed = session_->Complete({client::MakeCompleteItem(
      a, chunk, kPageSize, /*unfinished=*/true)});
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_TRUE(completed->results(0).backup_attached());
}

// Under the default write policy (write_ahead) the host tier is
// prefix-closed: BACKUP_CHOICE_ALWAYS below a device hit without a host copy
// prepares nothing (backup_id 0; it could never attach), and the request
// runs as usual.
TEST_F(SessionTest, AlwaysBelowAPrefixWithoutAHostCopyPreparesNothing) {
  Cache(Seq(0, 8));  // On device only.
  auto admitted = session_->Admit({client::MakeAdmitItem(
      Seq(0, 14), 0, v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
      v1::BACKUP_CHOICE_ALWAYS)});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const v1::AdmitResult& a = admitted->results(0);
  ASSERT_TRUE(a.admitted());
  EXPECT_EQ(a.device().valid_tokens(), 8);
  EXPECT_EQ(a.backup_id(), 0u);
  auto completed = session_->Complete(
      {client::MakeCompleteItem(a, Seq(0, 14), kPageSize)});
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_FALSE(completed->results(0).backup_attached());
  EXPECT_EQ(Stats().session_pages(), 0);
  EXPECT_EQ(Stats().pending_backups(), 0);
  // At the root (no device hit), ALWAYS backs up.
  auto fresh = session_->Admit({client::MakeAdmitItem(
      Seq(100, 8), 0, v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
      v1::BACKUP_CHOICE_ALWAYS)});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->results(0).backup_id(), 0u);
  ASSERT_TRUE(session_->Complete({client::MakeCompleteItem(
                                     fresh->results(0), Seq(100, 8),
                                     kPageSize)})
                  .ok());
}

TEST_F(SessionTest, AdmitThenCompleteInTwoRoundTrips) {
  std::vector<std::unique_ptr<client::Session>> workers;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    workers.push_back(Open(v1::ROLE_WORKER, rank));
  }
  // 2 pages on device with a host copy (the default write policy's host
  // tier is prefix-closed: a backup below them needs it).
  auto first = session_->Admit({client::MakeAdmitItem(
      Seq(0, 8), 0, v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
      v1::BACKUP_CHOICE_ALWAYS)});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_NE(first->results(0).backup_id(), 0u);
  ASSERT_NO_FATAL_FAILURE(
      StoreOnWorkers(workers, first->results(0).backup_id(), num_steps_));
  auto cached_first = session_->Complete(
      {client::MakeCompleteItem(first->results(0), Seq(0, 8), kPageSize)});
  ASSERT_TRUE(cached_first.ok()) << cached_first.status();
  const uint64_t cached = cached_first->results(0).node();
  AwaitCommitted([this] { return Stats(); }, 1);
  // 14 input tokens (8 hit) and 4 of output: 5 pages, 3 of them new.
  const std::vector<int32_t> input = Seq(0, 14);
  auto admitted = session_->Admit({client::MakeAdmitItem(
      input, 4, v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::BACKUP_CHOICE_ALWAYS)});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_EQ(admitted->results_size(), 1);
  const v1::AdmitResult& a = admitted->results(0);
  ASSERT_TRUE(a.admitted());
  EXPECT_FALSE(a.load());
  EXPECT_EQ(a.device().valid_tokens(), 8);
  EXPECT_EQ(a.device().pages_size(), 2);
  EXPECT_EQ(a.last_device_node(), cached);
  EXPECT_NE(a.lock_handle(), 0u);
  EXPECT_EQ(a.pages_size(), 3);
  ASSERT_NE(a.backup_id(), 0u);
  EXPECT_EQ(Stats().session_locks(), 1);
  EXPECT_EQ(Stats().session_pages(), 3);
  ASSERT_NO_FATAL_FAILURE(StoreOnWorkers(workers, a.backup_id(), num_steps_));
  const v1::CompleteItem item = client::MakeCompleteItem(a, input, kPageSize);
  ASSERT_EQ(item.free_pages_size(), 1);  // The unused output page.
  auto completed = session_->Complete({item});
  ASSERT_TRUE(completed.ok()) << completed.status();
  const v1::InsertResult& r = completed->results(0);
  EXPECT_FALSE(r.deferred());
  EXPECT_TRUE(r.backup_attached());
  // Everything the request held went to the tree or back to the pool.
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
  // The backup commits once both ranks stored both layers: a host copy.
  AwaitCommitted([this] { return Stats(); }, 2);
  // The next turn hits the cached input, page-floored.
  auto next = session_->Admit({client::MakeAdmitItem(Seq(0, 20), 0)});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->results(0).device().valid_tokens(), 12);
  auto done = session_->Complete(
      {client::MakeCompleteItem(next->results(0), Seq(0, 20), kPageSize)});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST_F(SessionTest, CompleteChecksHandlesAndPagesFirst) {
  Cache(Seq(0, 8));
  auto admitted = session_->Admit({client::MakeAdmitItem(
      Seq(0, 12), 4, v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
      v1::BACKUP_CHOICE_NEVER)});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const v1::AdmitResult& a = admitted->results(0);
  ASSERT_TRUE(a.admitted());
  EXPECT_EQ(a.backup_id(), 0u);  // NEVER: no backup.
  const v1::CompleteItem good = client::MakeCompleteItem(a, Seq(0, 12), 4);
  // A handle this session does not hold: an error, nothing changed.
  v1::CompleteItem bad_handle = good;
  bad_handle.set_lock_handles(0, 987654);
  absl::Status refused = session_->Complete({bad_handle}).status();
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("Complete: "));
  // A page to free that is not the session's: an error, nothing changed.
  v1::CompleteItem bad_page = good;
  bad_page.add_free_pages(a.device().pages(0));  // The tree's page.
  EXPECT_FALSE(session_->Complete({bad_page}).ok());
  EXPECT_EQ(Stats().session_locks(), 1);
  EXPECT_EQ(Stats().session_pages(), 2);
  auto completed = session_->Complete({good});
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_EQ(Stats().session_locks(), 0);
  EXPECT_EQ(Stats().session_pages(), 0);
  // The same handle again: released already.
  EXPECT_FALSE(session_->Complete({good}).ok());
}

TEST_F(SessionTest, AdmitIsFirstComeFirstServed) {
  // Hold most of the pool: 2 x 8 pages, page 0 of each lane reserved.
  const std::vector<int64_t> held = AllocatePages(10);
  ASSERT_EQ(held.size(), 10u);
  auto admitted = session_->Admit({client::MakeAdmitItem(Seq(0, 8)),
                                   client::MakeAdmitItem(Seq(100, 16)),
                                   client::MakeAdmitItem(Seq(200, 4))});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  ASSERT_EQ(admitted->results_size(), 3);
  EXPECT_TRUE(admitted->results(0).admitted());
  EXPECT_FALSE(admitted->results(1).admitted());
  EXPECT_FALSE(admitted->results(2).admitted());  // Behind the one waiting.
  EXPECT_EQ(Stats().session_pages(), 12);  // Only the first one's 2 pages.
  // A request larger than the whole pool is an error of the call.
  auto too_big = session_->Admit({client::MakeAdmitItem(Seq(0, 200))});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("Admit: "));
  EXPECT_FALSE(session_->Admit({client::MakeAdmitItem({})}).ok());  // Empty.
}

TEST_F(SessionTest, AdmitAnswersLoadForAHostHit) {
  ASSERT_NO_FATAL_FAILURE(CacheOnHostOnly(Seq(0, 8)));
  auto admitted = session_->Admit({client::MakeAdmitItem(Seq(0, 12), 4)});
  ASSERT_TRUE(admitted.ok()) << admitted.status();
  const v1::AdmitResult& a = admitted->results(0);
  ASSERT_TRUE(a.admitted());
  ASSERT_TRUE(a.load());
  EXPECT_EQ(a.host_hit_tokens(), 8);
  EXPECT_EQ(a.pages_size(), 0);  // Nothing allocated.
  // Load it back with room for the extend, then the hit is on device.
  auto loaded = session_->LoadBack(Seq(0, 12), /*extend_tokens=*/8);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->ok());
  EXPECT_EQ(loaded->started.loaded_tokens(), 8);
  EXPECT_EQ(loaded->layers_loaded, static_cast<int>(2 * num_steps_));
  std::vector<uint64_t> handles = {loaded->lock_handle()};
  if (a.lock_handle() != 0) handles.push_back(a.lock_handle());
  ASSERT_TRUE(session_->UnlockHandles(handles).ok());
  EXPECT_EQ(Stats().session_locks(), 0);
}

TEST(MakeCompleteItemTest, CachesTheTokensPagesAndFreesTheRest) {
  v1::AdmitResult admitted;
  admitted.set_admitted(true);
  admitted.mutable_device()->add_pages(10);
  admitted.mutable_device()->add_pages(11);
  admitted.mutable_device()->set_valid_tokens(8);
  admitted.set_lock_handle(7);
  admitted.set_backup_id(9);
  for (int64_t page : {20, 21, 22}) admitted.add_pages(page);
  // 13 tokens cached: 4 pages; the reserve's last page is freed.
  const v1::CompleteItem item =
      client::MakeCompleteItem(admitted, Seq(0, 13), kPageSize);
  EXPECT_THAT(item.pages(), ElementsAre(10, 11, 20, 21));
  EXPECT_THAT(item.free_pages(), ElementsAre(22));
  EXPECT_THAT(item.lock_handles(), ElementsAre(7));
  EXPECT_EQ(item.backup_id(), 9u);
  EXPECT_TRUE(item.free_uncached());
  EXPECT_EQ(item.tokens(), client::PackTokens(Seq(0, 13)));
  // Nothing hit: no handle to release.
  admitted.set_lock_handle(0);
  EXPECT_TRUE(client::MakeCompleteItem(admitted, Seq(0, 4), kPageSize)
                  .lock_handles()
                  .empty());
  const v1::AdmitItem admit = client::MakeAdmitItem(
      Seq(0, 5), 3, v1::COMPUTE_OWNER_MODE_ZIGZAG, v1::BACKUP_CHOICE_NEVER);
  EXPECT_EQ(admit.tokens(), client::PackTokens(Seq(0, 5)));
  EXPECT_EQ(admit.reserve_tokens(), 3);
  EXPECT_EQ(admit.mode(), v1::COMPUTE_OWNER_MODE_ZIGZAG);
  EXPECT_EQ(admit.backup(), v1::BACKUP_CHOICE_NEVER);
}

}  // namespace
}  // namespace hicache
