// API v1.1 (issue 12): the answers a scheduler written from the proto and
// the docs alone relies on, each reproduced through a real DaemonServer.
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using testing::Pack;
using testing::Seq;

class ApiV11Test : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.page_size = 4;
    config.cp_size = 2;
    config.device_pages_per_rank = 8;
    config.host_pages_per_rank = 16;
    // Written against write_through_selective (write-through at the
    // second hit); the default is write_ahead.
    config.write_policy = WritePolicy::kWriteThroughSelective;
    config.operator_uids = {static_cast<uint32_t>(getuid())};
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
    session_ = Open();
  }

  std::string Open(v1::Role role = v1::ROLE_SCHEDULER, uint32_t rank = 0,
                   const std::string& ns = "") {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("v11");
    request.set_role(role);
    request.set_rank(rank);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&ctx, request, &response).ok());
    return response.session_id();
  }

  // Caches tokens [0, n) on the device: allocate, insert. Returns false if
  // the daemon had no room.
  bool Cache(int n) {
    v1::AllocateResponse allocation;
    {
      grpc::ClientContext ctx;
      v1::AllocateRequest request;
      request.set_session_id(session_);
      request.add_items()->set_num_pages(n / 4);
      if (!stub_->Allocate(&ctx, request, &allocation).ok()) return false;
    }
    grpc::ClientContext ctx;
    v1::InsertRequest request;
    request.set_session_id(session_);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(Seq(0, n)));
    item->mutable_pages()->Add(allocation.allocations(0).pages().begin(),
                               allocation.allocations(0).pages().end());
    v1::InsertResponse response;
    return stub_->Insert(&ctx, request, &response).ok();
  }

  v1::MatchResult MatchAndLock(int n) {
    grpc::ClientContext ctx;
    v1::MatchPrefixRequest request;
    request.set_session_id(session_);
    request.add_items()->set_tokens(Pack(Seq(0, n)));
    request.set_lock(true);
    v1::MatchPrefixResponse response;
    EXPECT_TRUE(stub_->MatchPrefix(&ctx, request, &response).ok());
    return response.results(0);
  }

  grpc::Status UnlockHandles(std::vector<uint64_t> handles) {
    grpc::ClientContext ctx;
    v1::LockRequest request;
    request.set_session_id(session_);
    request.mutable_lock_handles()->Add(handles.begin(), handles.end());
    v1::LockResponse response;
    return stub_->Unlock(&ctx, request, &response);
  }

  int64_t SessionLocks() {
    grpc::ClientContext ctx;
    v1::CacheStats stats;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::GetStatsRequest(), &stats).ok());
    return stats.session_locks();
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
  std::string session_;
};

// Item 3: a LoadBack with nothing to load still ends with `done`.
TEST_F(ApiV11Test, LoadBackWithNothingToLoadEndsWithDone) {
  grpc::ClientContext ctx;
  v1::LoadBackRequest request;
  request.set_session_id(session_);
  request.set_tokens(Pack(Seq(0, 8)));
  auto load = stub_->LoadBack(&ctx, request);
  v1::LoadBackEvent event;
  ASSERT_TRUE(load->Read(&event));
  ASSERT_TRUE(event.has_started());
  EXPECT_EQ(event.started().load_id(), 0u);
  ASSERT_TRUE(load->Read(&event)) << "no terminal event";
  ASSERT_TRUE(event.has_done()) << event.DebugString();
  EXPECT_TRUE(event.done().ok());
  EXPECT_FALSE(load->Read(&event));
  EXPECT_TRUE(load->Finish().ok());
}

// Item 10: pages and owners that disagree are refused, not truncated.
TEST_F(ApiV11Test, AllocateItemWithMismatchedOwnersIsRefused) {
  grpc::ClientContext ctx;
  v1::AllocateRequest request;
  request.set_session_id(session_);
  v1::AllocateItem* item = request.add_items();
  item->set_num_pages(3);
  item->add_owners(0);
  item->add_owners(1);
  v1::AllocateResponse response;
  grpc::Status status = stub_->Allocate(&ctx, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("either owners"));
}

// Item 6: two requests that hit one node hold two handles; releasing one
// leaves the other's lock in place, and handles cannot be reused.
TEST_F(ApiV11Test, LocksHaveHandles) {
  ASSERT_TRUE(Cache(8));
  const v1::MatchResult first = MatchAndLock(8);
  const v1::MatchResult second = MatchAndLock(8);
  ASSERT_EQ(first.last_device_node(), second.last_device_node());
  ASSERT_NE(first.lock_handle(), 0u);
  ASSERT_NE(second.lock_handle(), 0u);
  EXPECT_NE(first.lock_handle(), second.lock_handle());
  EXPECT_EQ(SessionLocks(), 2);
  EXPECT_EQ(UnlockHandles({second.lock_handle(), second.lock_handle()})
                .error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(SessionLocks(), 2);  // Refused: nothing released.
  ASSERT_TRUE(UnlockHandles({first.lock_handle()}).ok());
  EXPECT_EQ(SessionLocks(), 1);
  EXPECT_EQ(UnlockHandles({first.lock_handle()}).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(UnlockHandles({second.lock_handle()}).ok());
  EXPECT_EQ(SessionLocks(), 0);
  // Lock by node answers a handle per node; a miss locks nothing.
  grpc::ClientContext ctx;
  v1::LockRequest request;
  request.set_session_id(session_);
  request.add_nodes(first.last_device_node());
  request.add_nodes(first.last_device_node());
  v1::LockResponse response;
  ASSERT_TRUE(stub_->Lock(&ctx, request, &response).ok());
  ASSERT_EQ(response.lock_handles_size(), 2);
  EXPECT_NE(response.lock_handles(0), response.lock_handles(1));
  EXPECT_EQ(MatchAndLock(0).lock_handle(), 0u);
  // Another session cannot release them.
  const std::string other = Open();
  grpc::ClientContext octx;
  v1::LockRequest foreign;
  foreign.set_session_id(other);
  foreign.add_lock_handles(response.lock_handles(0));
  EXPECT_EQ(stub_->Unlock(&octx, foreign, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// Item 7: MatchPrefix(lock) matches and locks in one step, so an operator
// eviction racing it can never free a hit the response reports.
TEST_F(ApiV11Test, MatchAndLockIsAtomicAgainstEviction) {
  std::atomic<bool> stop{false};
  std::thread evictor([&] {
    while (!stop.load()) {
      grpc::ClientContext ctx;
      v1::EvictRequest request;
      request.add_device_pages_per_lane(7);
      request.add_device_pages_per_lane(7);
      v1::EvictResponse response;
      (void)stub_->Evict(&ctx, request, &response);
    }
  });
  int hits = 0;
  for (int i = 0; i < 300; ++i) {
    const v1::MatchResult match = MatchAndLock(8);
    if (match.device().valid_tokens() == 0) {
      (void)Cache(8);
      continue;
    }
    ++hits;
    // The reported node still holds exactly the reported pages.
    grpc::ClientContext ctx;
    v1::InspectNodeRequest inspect;
    inspect.set_node(match.last_device_node());
    v1::NodeInfo node;
    ASSERT_TRUE(stub_->InspectNode(&ctx, inspect, &node).ok()) << i;
    EXPECT_GT(node.lock_ref(), 0);
    EXPECT_NE(node.tier(), "host") << i;
    ASSERT_TRUE(UnlockHandles({match.lock_handle()}).ok());
  }
  stop = true;
  evictor.join();
  EXPECT_GT(hits, 0);
  EXPECT_EQ(SessionLocks(), 0);
}

// Item 4: FinishLoad is an RPC: a scheduler can abandon a load it started
// (or release one its stream has not handed over), and only its own.
TEST_F(ApiV11Test, FinishLoadAbandonsARunningLoad) {
  ASSERT_TRUE(Cache(16));
  // Hits make the node qualify for write-through; wait for its host copy.
  for (int i = 0; i < 3; ++i) {
    const v1::MatchResult hit = MatchAndLock(16);
    ASSERT_TRUE(UnlockHandles({hit.lock_handle()}).ok());
  }
  bool on_host = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       !on_host && absl::Now() < deadline;) {
    grpc::ClientContext ctx;
    v1::MatchPrefixRequest request;
    request.set_session_id(session_);
    request.add_items()->set_tokens(Pack(Seq(0, 16)));
    request.set_peek(true);
    v1::MatchPrefixResponse response;
    ASSERT_TRUE(stub_->MatchPrefix(&ctx, request, &response).ok());
    grpc::ClientContext ictx;
    v1::InspectNodeRequest inspect;
    inspect.set_node(response.results(0).last_device_node());
    v1::NodeInfo node;
    on_host = stub_->InspectNode(&ictx, inspect, &node).ok() &&
              node.tier() == "both";
    if (!on_host) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(on_host) << "the write-through backup never committed";
  {
    grpc::ClientContext ctx;
    v1::EvictRequest request;
    request.add_device_pages_per_lane(7);
    request.add_device_pages_per_lane(7);
    v1::EvictResponse response;
    ASSERT_TRUE(stub_->Evict(&ctx, request, &response).ok());
  }
  grpc::ClientContext ctx;
  v1::LoadBackRequest request;
  request.set_session_id(session_);
  request.set_tokens(Pack(Seq(0, 16)));
  auto load = stub_->LoadBack(&ctx, request);
  v1::LoadBackEvent event;
  ASSERT_TRUE(load->Read(&event));
  ASSERT_TRUE(event.has_started());
  const uint64_t load_id = event.started().load_id();
  ASSERT_NE(load_id, 0u) << event.DebugString();
  auto finish = [&](const std::string& session, uint64_t id) {
    grpc::ClientContext fctx;
    v1::FinishLoadRequest finish_request;
    finish_request.set_session_id(session);
    finish_request.set_load_id(id);
    v1::FinishLoadResponse response;
    return stub_->FinishLoad(&fctx, finish_request, &response);
  };
  // Not another session's to finish.
  EXPECT_FALSE(finish(Open(), load_id).ok());
  // The copies of this tiny load may already be done and its stream may
  // have handed it over: then it is no longer the session's to finish.
  const grpc::Status finished = finish(session_, load_id);
  EXPECT_TRUE(finished.ok() ||
              finished.error_message().find("not a load") != std::string::npos)
      << finished.error_message();
  bool got_done = false;
  while (load->Read(&event)) {
    if (!event.has_done()) continue;
    got_done = true;
    // Whether the copies beat the abandonment or not, the answer is
    // consistent: a hit comes with a lock, a miss with none.
    EXPECT_EQ(event.done().ok(), event.done().lock_handle() != 0);
    EXPECT_EQ(SessionLocks(), event.done().ok() ? 1 : 0);
  }
  EXPECT_TRUE(got_done);
  EXPECT_TRUE(load->Finish().ok());
  EXPECT_FALSE(finish(session_, load_id).ok());  // Already finished.
}

// One layer_stored message on a fresh BackupSession stream of `session`;
// returns the stream's replies (errors, for a worker).
std::vector<v1::BackupServerMessage> StoreOnce(v1::HiCache::Stub* stub,
                                               const std::string& session,
                                               uint64_t backup, uint32_t step) {
  grpc::ClientContext ctx;
  auto stream = stub->BackupSession(&ctx);
  v1::BackupClientMessage stored;
  stored.set_session_id(session);
  stored.mutable_layer_stored()->add_backup_ids(backup);
  stored.mutable_layer_stored()->set_step(step);
  EXPECT_TRUE(stream->Write(stored));
  stream->WritesDone();
  std::vector<v1::BackupServerMessage> replies;
  v1::BackupServerMessage reply;
  while (stream->Read(&reply)) replies.push_back(reply);
  EXPECT_TRUE(stream->Finish().ok());
  return replies;
}

// Item 1: workers ack their own layers. Each worker session sends
// layer_stored for its rank; the scheduler's backup commits once every
// rank stored every step, with no relay through the scheduler.
TEST_F(ApiV11Test, WorkersStoreTheirOwnRanksLayers) {
  const std::string worker0 = Open(v1::ROLE_WORKER, 0);
  const std::string worker1 = Open(v1::ROLE_WORKER, 1);
  const std::string stranger = Open(v1::ROLE_WORKER, 0, "other-tenant");
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session_);
    v1::AllocateItem* item = request.add_items();
    for (uint32_t owner : {0, 1}) item->add_owners(owner);
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
  }
  const auto& pages = allocation.allocations(0).pages();
  grpc::ClientContext ctx;
  auto stream = stub_->BackupSession(&ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id(session_);
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->mutable_pages()->Add(pages.begin(), pages.end());
  spec->set_logical_tokens(8);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  const uint64_t backup = reply.prepared().backup_ids(0);
  ASSERT_NE(backup, 0u);
  // A worker of another namespace may not store it.
  std::vector<v1::BackupServerMessage> refused =
      StoreOnce(stub_.get(), stranger, backup, 0);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].error().code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  // Rank 0's worker stores both layers: only rank 0's copies run.
  for (uint32_t step = 0; step < 2; ++step) {
    EXPECT_TRUE(StoreOnce(stub_.get(), worker0, backup, step).empty());
  }
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(stream->Read(&reply));
    ASSERT_TRUE(reply.has_step_done()) << reply.DebugString();
    EXPECT_EQ(reply.step_done().rank(), 0u);
  }
  {
    grpc::ClientContext ictx;
    v1::InsertRequest request;
    request.set_session_id(session_);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(Seq(0, 8)));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(backup);
    v1::InsertResponse inserted;
    ASSERT_TRUE(stub_->Insert(&ictx, request, &inserted).ok());
    ASSERT_TRUE(inserted.results(0).backup_attached());
  }
  // Rank 1's worker stores its share; then the backup commits.
  for (uint32_t step = 0; step < 2; ++step) {
    EXPECT_TRUE(StoreOnce(stub_.get(), worker1, backup, step).empty());
  }
  int rank1_steps = 0;
  bool committed = false;
  while (!committed && stream->Read(&reply)) {
    rank1_steps += reply.has_step_done() && reply.step_done().rank() == 1;
    committed = reply.has_committed();
  }
  EXPECT_TRUE(committed);
  EXPECT_EQ(rank1_steps, 2);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Item 1 (second half): a worker subscribes to its own rank's events --
// backup steps, loaded layers with their fences, and every outcome of its
// namespace -- with no relay through the scheduler.
TEST_F(ApiV11Test, WorkersHearTheirRanksEvents) {
  const std::string worker1 = Open(v1::ROLE_WORKER, 1);
  const std::string stranger = Open(v1::ROLE_WORKER, 1, "other-tenant");
  grpc::ClientContext sub_ctx;
  v1::SubscribeRequest sub;
  sub.set_session_id(worker1);
  auto events = stub_->Subscribe(&sub_ctx, sub);
  v1::WorkerEvent live;
  ASSERT_TRUE(events->Read(&live));
  ASSERT_TRUE(live.has_subscribed());  // From here on nothing is missed.
  grpc::ClientContext stranger_ctx;
  stranger_ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::SubscribeRequest stranger_sub;
  stranger_sub.set_session_id(stranger);
  auto stranger_events = stub_->Subscribe(&stranger_ctx, stranger_sub);
  ASSERT_TRUE(stranger_events->Read(&live));
  ASSERT_TRUE(live.has_subscribed());
  {  // Schedulers have no rank to subscribe to.
    grpc::ClientContext ctx;
    v1::SubscribeRequest request;
    request.set_session_id(session_);
    auto refused = stub_->Subscribe(&ctx, request);
    v1::WorkerEvent event;
    EXPECT_FALSE(refused->Read(&event));
    EXPECT_EQ(refused->Finish().error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  // The scheduler backs a request up (both ranks) and caches it.
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session_);
    v1::AllocateItem* item = request.add_items();
    for (uint32_t owner : {0, 1}) item->add_owners(owner);
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
  }
  const auto& pages = allocation.allocations(0).pages();
  uint64_t backup = 0;
  {
    grpc::ClientContext ctx;
    auto stream = stub_->BackupSession(&ctx);
    v1::BackupClientMessage prepare;
    prepare.set_session_id(session_);
    v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
    spec->mutable_pages()->Add(pages.begin(), pages.end());
    spec->set_logical_tokens(8);
    ASSERT_TRUE(stream->Write(prepare));
    v1::BackupServerMessage reply;
    ASSERT_TRUE(stream->Read(&reply));
    backup = reply.prepared().backup_ids(0);
    for (uint32_t step = 0; step < 2; ++step) {
      v1::BackupClientMessage stored;
      stored.mutable_layer_stored()->add_backup_ids(backup);
      stored.mutable_layer_stored()->set_step(step);
      ASSERT_TRUE(stream->Write(stored));
    }
    grpc::ClientContext ictx;
    v1::InsertRequest request;
    request.set_session_id(session_);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(Seq(0, 8)));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(backup);
    v1::InsertResponse inserted;
    ASSERT_TRUE(stub_->Insert(&ictx, request, &inserted).ok());
    while (stream->Read(&reply) && !reply.has_committed()) {
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
  std::vector<uint32_t> steps;
  v1::WorkerEvent event;
  while (events->Read(&event)) {
    EXPECT_EQ(event.rank(), 1u);
    if (event.has_backup_step()) {
      EXPECT_EQ(event.backup_step().backup_id(), backup);
      steps.push_back(event.backup_step().step());
    }
    if (event.has_backup_ended()) {
      EXPECT_TRUE(event.backup_ended().committed());
      break;
    }
  }
  std::sort(steps.begin(), steps.end());  // Copies complete in any order.
  EXPECT_EQ(steps, (std::vector<uint32_t>{0, 1}));
  // Evicted and loaded back: the worker hears its rank's layers land.
  {
    grpc::ClientContext ctx;
    v1::EvictRequest request;
    request.add_device_pages_per_lane(7);
    request.add_device_pages_per_lane(7);
    v1::EvictResponse response;
    ASSERT_TRUE(stub_->Evict(&ctx, request, &response).ok());
  }
  grpc::ClientContext load_ctx;
  v1::LoadBackRequest load_request;
  load_request.set_session_id(session_);
  load_request.set_tokens(Pack(Seq(0, 8)));
  auto load = stub_->LoadBack(&load_ctx, load_request);
  v1::LoadBackEvent load_event;
  ASSERT_TRUE(load->Read(&load_event));
  const uint64_t load_id = load_event.started().load_id();
  ASSERT_NE(load_id, 0u);
  while (load->Read(&load_event)) {
  }
  EXPECT_TRUE(load->Finish().ok());
  int layers = 0;
  bool ended = false;
  while (!ended && events->Read(&event)) {
    if (event.has_layer_loaded()) {
      EXPECT_EQ(event.layer_loaded().load_id(), load_id);
      ++layers;
    }
    if (event.has_load_ended()) {
      EXPECT_TRUE(event.load_ended().ok());
      ended = true;
    }
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(layers, 2);
  sub_ctx.TryCancel();
  // The other tenant's worker heard nothing.
  EXPECT_FALSE(stranger_events->Read(&event)) << event.DebugString();
}

// Item 2: LoadBack takes a batch. Each item gets its started and done (a
// miss and a device-only hit at once), the loads' layers name their load,
// and the stream ends when every item is done.
TEST_F(ApiV11Test, BatchedLoadBack) {
  // Tokens [100, 108) end up on host only: backed up, then evicted.
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session_);
    request.add_items()->set_num_pages(2);
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
  }
  const auto& pages = allocation.allocations(0).pages();
  {
    grpc::ClientContext ctx;
    auto stream = stub_->BackupSession(&ctx);
    v1::BackupClientMessage prepare;
    prepare.set_session_id(session_);
    v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
    spec->mutable_pages()->Add(pages.begin(), pages.end());
    spec->set_logical_tokens(8);
    ASSERT_TRUE(stream->Write(prepare));
    v1::BackupServerMessage reply;
    ASSERT_TRUE(stream->Read(&reply));
    const uint64_t backup = reply.prepared().backup_ids(0);
    v1::BackupClientMessage store_all;
    store_all.mutable_store_all()->set_backup_id(backup);
    ASSERT_TRUE(stream->Write(store_all));
    grpc::ClientContext ictx;
    v1::InsertRequest request;
    request.set_session_id(session_);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(Seq(100, 8)));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(backup);
    v1::InsertResponse inserted;
    ASSERT_TRUE(stub_->Insert(&ictx, request, &inserted).ok());
    while (stream->Read(&reply) && !reply.has_committed()) {
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    grpc::ClientContext ectx;
    v1::EvictRequest evict;
    evict.add_device_pages_per_lane(7);
    evict.add_device_pages_per_lane(7);
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub_->Evict(&ectx, evict, &evicted).ok());
  }
  ASSERT_TRUE(Cache(8));  // Tokens [0, 8) on device.
  grpc::ClientContext ctx;
  v1::LoadBackRequest request;
  request.set_session_id(session_);
  request.add_items()->set_tokens(Pack(Seq(500, 8)));  // Miss.
  request.add_items()->set_tokens(Pack(Seq(0, 8)));    // Device hit.
  request.add_items()->set_tokens(Pack(Seq(100, 8)));  // Host hit: a load.
  auto load = stub_->LoadBack(&ctx, request);
  std::map<uint32_t, v1::LoadBackEvent::Started> started;
  std::map<uint32_t, v1::LoadBackEvent::Done> done;
  int layers = 0;
  v1::LoadBackEvent event;
  while (load->Read(&event)) {
    if (event.has_started()) started[event.started().item()] = event.started();
    if (event.has_done()) done[event.done().item()] = event.done();
    if (event.has_layer_loaded()) {
      ++layers;
      EXPECT_EQ(event.layer_loaded().load_id(), started[2].load_id());
    }
  }
  ASSERT_TRUE(load->Finish().ok());
  ASSERT_EQ(started.size(), 3u);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(started[0].load_id(), 0u);
  EXPECT_EQ(started[0].device_tokens() + started[0].loaded_tokens(), 0);
  EXPECT_EQ(started[1].load_id(), 0u);
  EXPECT_EQ(started[1].device_tokens(), 8);
  EXPECT_NE(started[1].lock_handle(), 0u);
  ASSERT_NE(started[2].load_id(), 0u);
  EXPECT_EQ(started[2].loaded_tokens(), 8);
  EXPECT_EQ(layers, 2 * 2);  // 2 steps x 2 ranks.
  for (const auto& [item, d] : done) EXPECT_TRUE(d.ok()) << item;
  EXPECT_EQ(done[2].load_id(), started[2].load_id());
  ASSERT_NE(done[2].lock_handle(), 0u);
  // Every lock the batch took has a handle in its events: the device hit's,
  // the load's and (a total miss locks the root, its `node`) the miss's.
  std::vector<uint64_t> handles = {started[1].lock_handle(),
                                   done[2].lock_handle()};
  if (started[0].lock_handle() != 0) {
    handles.push_back(started[0].lock_handle());
  }
  EXPECT_EQ(SessionLocks(), static_cast<int64_t>(handles.size()));
  ASSERT_TRUE(UnlockHandles(handles).ok());
  EXPECT_EQ(SessionLocks(), 0);
  // One request or a batch, not both.
  grpc::ClientContext bad_ctx;
  request.set_tokens(Pack(Seq(0, 4)));
  auto bad = stub_->LoadBack(&bad_ctx, request);
  EXPECT_FALSE(bad->Read(&event));
  EXPECT_EQ(bad->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Seed item "flags": the engine's tunables are flags, and GetStats reports
// what the daemon runs with.
TEST(ApiV11SettingsTest, GetStatsReportsTheTunables) {
  testing::TempDir dir;
  const std::string socket = dir.Child("s.sock");
  FakeClock clock{absl::FromUnixSeconds(100)};
  DaemonConfig config;
  config.page_size = 4;
  config.device_pages_per_rank = 16;
  config.host_pages_per_rank = 32;
  config.write_through_threshold = 3;
  config.load_back_threshold_tokens = 8;
  config.l1_free_room_pages = 2;
  config.l2_free_room_pages = 4;
  config.transfer_workers = 3;
  auto server = DaemonServer::Start(config, socket, &clock);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::HiCache::NewStub(grpc::CreateChannel(
      client::UnixTarget(socket), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::GetStatsResponse stats;
  ASSERT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
  const v1::EngineSettings& s = stats.settings();
  EXPECT_EQ(s.write_policy(), "write_ahead");  // The default.
  EXPECT_EQ(s.write_through_threshold(), 3u);
  EXPECT_EQ(s.load_back_threshold_tokens(), 8);
  EXPECT_EQ(s.l1_free_room_pages(), 2);
  EXPECT_EQ(s.l2_free_room_pages(), 4);
  EXPECT_EQ(s.transfer_workers(), 3);
  // And the engine runs with them.
  EXPECT_EQ((*server)->engine().options().load_back_threshold_tokens, 8);
  EXPECT_EQ((*server)->engine().options().write_through_threshold, 3u);
  EXPECT_EQ((*server)->engine().options().l1_free_room_pages, 2);
}

}  // namespace
}  // namespace hicache
