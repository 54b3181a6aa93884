// The cache RPCs through a real DaemonServer on a unix socket, with the
// generated stubs: a full scheduler/worker flow, leases, and one case per
// validation rule with its exact code.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <numeric>

#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "daemon/main/daemon_server.h"
#include "daemon/pool/kv_geometry.h"
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

class CacheServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.page_size = 4;
    config.cp_size = 2;
    config.device_pages_per_rank = 8;
    config.host_pages_per_rank = 16;
    config.kv_preset = "tiny";
    config.default_lease_ms = 1000;
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
  }

  std::string Open(const std::string& ns = "") {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("test");
    request.set_role(v1::ROLE_SCHEDULER);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&ctx, request, &response).ok());
    return response.session_id();
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
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

// GetLayout states every block's byte address and the step -> block map,
// which must agree with the geometry the copies use.
TEST_F(CacheServiceTest, LayoutStatesEveryByteAddress) {
  v1::GetLayoutResponse layout;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetLayout(&ctx, v1::GetLayoutRequest(), &layout).ok());
  const KvGeometry geometry = *KvGeometry::Preset("tiny", 4);
  EXPECT_EQ(layout.backend(), "cpu");
  EXPECT_FALSE(layout.fences());
  ASSERT_EQ(layout.device_blocks_size(), 2);  // "tiny": 1 family, 2 layers.
  ASSERT_EQ(layout.host_blocks_size(), 2);
  for (int i = 0; i < layout.device_blocks_size(); ++i) {
    const v1::BlockAddress& d = layout.device_blocks(i);
    const v1::BlockAddress& h = layout.host_blocks(i);
    for (int64_t page : {0, 3, 7}) {
      EXPECT_EQ(d.offset() + page * d.page_stride(),
                geometry.DeviceOffset(8, page, d.family(), d.layer()));
    }
    for (int64_t page : {0, 5, 15}) {
      EXPECT_EQ(h.offset() + page * h.page_stride(),
                geometry.HostOffset(HostLayout::kLayerFirst, 16, page,
                                    h.family(), h.layer()));
    }
    EXPECT_EQ(d.block_bytes(), geometry.BlockBytes(d.family()));
  }
  ASSERT_EQ(layout.steps_size(), 2);
  for (uint32_t step = 0; step < 2; ++step) {
    ASSERT_EQ(layout.steps(step).blocks_size(), 1);
    const v1::BlockAddress& block =
        layout.device_blocks(layout.steps(step).blocks(0));
    EXPECT_EQ(block.layer(), step);
  }
}

// Fences need a backend with events: the CPU backend refuses them clearly,
// a malformed handle is refused before anything else, and a layer_stored
// naming an unknown fence changes nothing.
TEST_F(CacheServiceTest, FencesOnTheCpuBackend) {
  const std::string session = Open();
  auto register_fence = [&](std::string handle, uint32_t rank) {
    grpc::ClientContext ctx;
    v1::RegisterFenceRequest request;
    request.set_session_id(session);
    request.set_rank(rank);
    request.set_event_handle(std::move(handle));
    v1::RegisterFenceResponse response;
    return stub_->RegisterFence(&ctx, request, &response);
  };
  grpc::Status status = register_fence(std::string(64, 'e'), 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("no events"));
  status = register_fence("short", 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("64"));
  {
    grpc::ClientContext ctx;
    v1::ReleaseFenceRequest request;
    request.set_session_id(session);
    request.set_fence_id(1);
    v1::ReleaseFenceResponse response;
    EXPECT_EQ(stub_->ReleaseFence(&ctx, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // A backup whose layer_stored names a fence nobody registered.
  grpc::ClientContext ctx;
  auto stream = stub_->BackupSession(&ctx);
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext actx;
    v1::AllocateRequest request;
    request.set_session_id(session);
    request.add_items()->set_num_pages(1);
    ASSERT_TRUE(stub_->Allocate(&actx, request, &allocation).ok());
  }
  v1::BackupClientMessage prepare;
  prepare.set_session_id(session);
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->add_pages(allocation.allocations(0).pages(0));
  spec->set_logical_tokens(4);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage prepared;
  ASSERT_TRUE(stream->Read(&prepared));
  ASSERT_EQ(prepared.prepared().backup_ids_size(), 1);
  v1::BackupClientMessage stored;
  stored.mutable_layer_stored()->add_backup_ids(
      prepared.prepared().backup_ids(0));
  stored.mutable_layer_stored()->set_step(0);
  v1::RankFence* fence = stored.mutable_layer_stored()->add_fences();
  fence->set_rank(0);
  fence->set_fence_id(42);
  ASSERT_TRUE(stream->Write(stored));
  stream->WritesDone();
  v1::BackupServerMessage reply;
  int errors = 0;
  while (stream->Read(&reply)) {
    EXPECT_FALSE(reply.has_step_done()) << reply.DebugString();
    if (reply.has_error()) {
      ++errors;
      EXPECT_EQ(reply.error().code(), static_cast<int>(absl::StatusCode::kNotFound));
      EXPECT_THAT(reply.error().message(), HasSubstr("fences[0] = 42"));
    }
  }
  EXPECT_EQ(errors, 1);
  EXPECT_TRUE(stream->Finish().ok());
  // Nothing was copied: the half-closed stream rolled the backup back.
  EXPECT_EQ(Stats().backups_committed(), 0);
}

TEST_F(CacheServiceTest, SchedulerAndWorkerFlowWithBackupAndLoadBack) {
  const std::string session = Open();
  // Layout: the worker maps rank 0's device segment by name.
  v1::GetLayoutResponse layout;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLayout(&ctx, v1::GetLayoutRequest(), &layout).ok());
  }
  ASSERT_EQ(layout.ranks_size(), 2);
  EXPECT_EQ(layout.num_steps(), 2u);
  EXPECT_EQ(layout.ranks(0).device().kind(), "shm");
  // Allocate 2 pages on lane 0 (owners [0, 0]).
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session);
    v1::AllocateItem* item = request.add_items();
    item->add_owners(0);
    item->add_owners(0);
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
  }
  const auto& pages = allocation.allocations(0).pages();
  ASSERT_EQ(pages.size(), 2);
  // "Worker" writes KV bytes through the shared-memory mapping.
  const v1::PoolSegment& segment = layout.ranks(0).device();
  const int fd = shm_open(segment.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  auto* device =
      static_cast<uint8_t*>(mmap(nullptr, segment.size_bytes(),
                                 PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  const KvGeometry geometry = *KvGeometry::Preset("tiny", 4);
  auto block = [&](int64_t logical, uint32_t layer) {
    return device + geometry.DeviceOffset(8, logical / 2, 0, layer);
  };
  for (int64_t p : pages) {
    for (uint32_t l = 0; l < 2; ++l) std::memset(block(p, l), 0x40 + p + l, 64);
  }
  // Backup stream: prepare, per-layer stored, insert with the backup id.
  grpc::ClientContext backup_ctx;
  auto stream = stub_->BackupSession(&backup_ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id(session);
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->mutable_pages()->Add(pages.begin(), pages.end());
  spec->set_logical_tokens(8);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_prepared()) << reply.DebugString();
  const uint64_t backup = reply.prepared().backup_ids(0);
  ASSERT_NE(backup, 0u);
  for (uint32_t step = 0; step < 2; ++step) {
    v1::BackupClientMessage stored;
    stored.set_session_id(session);
    stored.mutable_layer_stored()->add_backup_ids(backup);
    stored.mutable_layer_stored()->set_step(step);
    ASSERT_TRUE(stream->Write(stored));
  }
  v1::InsertResponse inserted;
  {
    grpc::ClientContext ctx;
    v1::InsertRequest request;
    request.set_session_id(session);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(Seq(0, 8)));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(backup);
    ASSERT_TRUE(stub_->Insert(&ctx, request, &inserted).ok());
  }
  EXPECT_TRUE(inserted.results(0).backup_attached());
  bool committed = false;
  while (!committed && stream->Read(&reply)) committed = reply.has_committed();
  EXPECT_TRUE(committed);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  // Evict everything from the device, then load back over the stream.
  {
    grpc::ClientContext ctx;
    v1::EvictRequest request;
    request.add_device_pages_per_lane(7);
    v1::EvictResponse response;
    ASSERT_TRUE(stub_->Evict(&ctx, request, &response).ok());
    EXPECT_EQ(response.device_pages_freed(), 2);
  }
  grpc::ClientContext load_ctx;
  v1::LoadBackRequest load_request;
  load_request.set_session_id(session);
  load_request.set_tokens(Pack(Seq(0, 8)));
  auto load = stub_->LoadBack(&load_ctx, load_request);
  v1::LoadBackEvent event;
  ASSERT_TRUE(load->Read(&event));
  ASSERT_TRUE(event.has_started());
  EXPECT_EQ(event.started().loaded_tokens(), 8);
  const auto loaded = event.started().locations().pages();
  int layers = 0;
  bool done = false;
  while (load->Read(&event)) {
    layers += event.has_layer_loaded();
    if (event.has_done()) done = event.done().ok();
  }
  EXPECT_TRUE(load->Finish().ok());
  EXPECT_TRUE(done);
  EXPECT_EQ(layers, 2 * 2);  // 2 steps x 2 ranks (rank 1 a no-op).
  for (int i = 0; i < 2; ++i) {
    for (uint32_t l = 0; l < 2; ++l) {
      EXPECT_EQ(block(loaded[i], l)[0], 0x40 + pages[i] + l) << i << " " << l;
    }
  }
  munmap(device, segment.size_bytes());
  // Closing releases the lock the load handed over.
  EXPECT_EQ(Stats().session_locks(), 1);
  grpc::ClientContext ctx;
  v1::CloseSessionRequest close;
  close.set_session_id(session);
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(stub_->CloseSession(&ctx, close, &closed).ok());
  EXPECT_EQ(closed.released_locks(), 1u);
  EXPECT_EQ(Stats().sessions(), 0);
  EXPECT_EQ(Stats().protected_tokens(), 0);
}

TEST_F(CacheServiceTest, ExpiredLeaseReleasesEverything) {
  const std::string session = Open();
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session);
    request.add_items()->set_num_pages(3);
    v1::AllocateResponse response;
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &response).ok());
  }
  EXPECT_EQ(Stats().session_pages(), 3);
  clock_.Advance(absl::Seconds(2));  // Past the 1 s default lease.
  // The reaper thread closes it: a generous bound for a busy machine.
  for (const absl::Time deadline = absl::Now() + absl::Seconds(60);
       Stats().sessions() > 0 && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const v1::CacheStats stats = Stats();
  EXPECT_EQ(stats.sessions(), 0);
  int64_t allocated = 0;
  for (const auto& lane : stats.lanes()) allocated += lane.allocated();
  EXPECT_EQ(allocated, 0);
  grpc::ClientContext ctx;
  v1::KeepAliveRequest keep;
  keep.set_session_id(session);
  v1::KeepAliveResponse kept;
  EXPECT_EQ(stub_->KeepAlive(&ctx, keep, &kept).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(CacheServiceTest, BadInputGetsTheRightCode) {
  const std::string session = Open();
  struct Case {
    const char* name;
    std::function<grpc::Status()> call;
    grpc::StatusCode code;
    const char* message;
  };
  auto allocate = [&](std::function<void(v1::AllocateRequest*)> fill) {
    return [this, fill] {
      grpc::ClientContext ctx;
      v1::AllocateRequest request;
      fill(&request);
      v1::AllocateResponse response;
      return stub_->Allocate(&ctx, request, &response);
    };
  };
  const std::vector<Case> cases = {
      {"open without name",
       [&] {
         grpc::ClientContext ctx;
         v1::OpenSessionRequest r;
         r.set_role(v1::ROLE_WORKER);
         v1::OpenSessionResponse out;
         return stub_->OpenSession(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "client_name"},
      {"open with rank >= C",
       [&] {
         grpc::ClientContext ctx;
         v1::OpenSessionRequest r;
         r.set_client_name("w");
         r.set_role(v1::ROLE_WORKER);
         r.set_rank(2);
         v1::OpenSessionResponse out;
         return stub_->OpenSession(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "rank 2"},
      {"unknown session", allocate([](v1::AllocateRequest* r) {
         r->set_session_id("nope");
         r->add_items()->set_num_pages(1);
       }),
       grpc::StatusCode::NOT_FOUND, "unknown"},
      {"owner >= C", allocate([&](v1::AllocateRequest* r) {
         r->set_session_id(session);
         r->add_items()->add_owners(2);
       }),
       grpc::StatusCode::INVALID_ARGUMENT, "owners[0] = 2"},
      {"negative count", allocate([&](v1::AllocateRequest* r) {
         r->set_session_id(session);
         r->add_items()->set_num_pages(-1);
       }),
       grpc::StatusCode::INVALID_ARGUMENT, "num_pages"},
      {"overflowing count", allocate([&](v1::AllocateRequest* r) {
         r->set_session_id(session);
         r->add_items()->set_num_pages(int64_t{1} << 50);
       }),
       grpc::StatusCode::RESOURCE_EXHAUSTED, "usable device pages"},
      {"tokens not a multiple of 4 bytes",
       [&] {
         grpc::ClientContext ctx;
         v1::MatchPrefixRequest r;
         r.set_session_id(session);
         r.add_items()->set_tokens("abc");
         v1::MatchPrefixResponse out;
         return stub_->MatchPrefix(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "items[0].tokens has 3 bytes"},
      {"insert with wrong page count",
       [&] {
         grpc::ClientContext ctx;
         v1::InsertRequest r;
         r.set_session_id(session);
         r.add_items()->set_tokens(Pack(Seq(0, 8)));
         v1::InsertResponse out;
         return stub_->Insert(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "needs 2 pages"},
      {"free a page of nobody",
       [&] {
         grpc::ClientContext ctx;
         v1::FreeRequest r;
         r.set_session_id(session);
         r.add_pages(5);
         v1::FreeResponse out;
         return stub_->Free(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "not held by this session"},
      {"unlock what is not locked",
       [&] {
         grpc::ClientContext ctx;
         v1::LockRequest r;
         r.set_session_id(session);
         r.add_nodes(1);
         v1::LockResponse out;
         return stub_->Unlock(&ctx, r, &out);
       },
       grpc::StatusCode::FAILED_PRECONDITION, "not locked by this session"},
      {"lock an unknown node",
       [&] {
         grpc::ClientContext ctx;
         v1::LockRequest r;
         r.set_session_id(session);
         r.add_nodes(987654);
         v1::LockResponse out;
         return stub_->Lock(&ctx, r, &out);
       },
       grpc::StatusCode::NOT_FOUND, "987654"},
      {"inspect an unknown node",
       [&] {
         grpc::ClientContext ctx;
         v1::InspectNodeRequest r;
         r.set_node(987654);
         v1::NodeInfo out;
         return stub_->InspectNode(&ctx, r, &out);
       },
       grpc::StatusCode::NOT_FOUND, "987654"},
      {"negative free room",
       [&] {
         grpc::ClientContext ctx;
         v1::SetFreeRoomRequest r;
         r.set_l1_pages_per_lane(-1);
         v1::SetFreeRoomResponse out;
         return stub_->SetFreeRoom(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "free-room"},
      {"negative quota",
       [&] {
         grpc::ClientContext ctx;
         v1::SetQuotaRequest r;
         r.mutable_quota()->set_namespace_("t");
         r.mutable_quota()->set_device_limit_pages(-1);
         v1::SetQuotaResponse out;
         return stub_->SetQuota(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, ">= 0"},
      {"quota guarantee above its limit",
       [&] {
         grpc::ClientContext ctx;
         v1::SetQuotaRequest r;
         r.mutable_quota()->set_namespace_("t");
         r.mutable_quota()->set_host_limit_pages(4);
         r.mutable_quota()->set_host_guaranteed_pages(5);
         v1::SetQuotaResponse out;
         return stub_->SetQuota(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "host_guaranteed"},
      {"quota guarantees above the pool",
       [&] {
         grpc::ClientContext ctx;
         v1::SetQuotaRequest r;
         r.mutable_quota()->set_namespace_("t");
         r.mutable_quota()->set_device_guaranteed_pages(int64_t{1} << 40);
         v1::SetQuotaResponse out;
         return stub_->SetQuota(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "guarantees"},
      {"quota of an over-long namespace",
       [&] {
         grpc::ClientContext ctx;
         v1::SetQuotaRequest r;
         r.mutable_quota()->set_namespace_(std::string(100000, 'n'));
         r.mutable_quota()->set_device_limit_pages(1);
         v1::SetQuotaResponse out;
         return stub_->SetQuota(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "bytes"},
      {"evict more lanes than C",
       [&] {
         grpc::ClientContext ctx;
         v1::EvictRequest r;
         r.add_device_pages_per_lane(1);
         r.add_device_pages_per_lane(1);
         r.add_device_pages_per_lane(1);
         v1::EvictResponse out;
         return stub_->Evict(&ctx, r, &out);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "cp_size"},
  };
  for (const Case& c : cases) {
    const grpc::Status status = c.call();
    EXPECT_EQ(status.error_code(), c.code)
        << c.name << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
  }
  // Nothing was partly applied.
  const v1::CacheStats stats = Stats();
  EXPECT_EQ(stats.session_pages(), 0);
  EXPECT_EQ(stats.nodes(), 0);
}

TEST_F(CacheServiceTest, WatchStreamsSessionAndBackupEvents) {
  grpc::ClientContext watch_ctx;
  auto watch = stub_->Watch(&watch_ctx, v1::WatchRequest());
  auto close_session = [this](const std::string& id) {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest close;
    close.set_session_id(id);
    v1::CloseSessionResponse closed;
    return stub_->CloseSession(&ctx, close, &closed).ok();
  };
  {
    // The stream has subscribed once any event arrives: probe sessions
    // open and close until then (no guess at when it subscribes).
    std::atomic<bool> subscribed{false};
    std::thread prober([&] {
      while (!subscribed.load()) {
        (void)close_session(Open());
        absl::SleepFor(absl::Milliseconds(20));  // Pacing only.
      }
    });
    v1::CacheEvent first;
    const bool read = watch->Read(&first);
    subscribed.store(true);
    prober.join();
    ASSERT_TRUE(read);
  }
  const std::string session = Open();
  ASSERT_TRUE(close_session(session));
  std::vector<std::string> kinds;
  v1::CacheEvent event;
  while (kinds.size() < 2 && watch->Read(&event)) {
    if (event.session_id() != session) continue;  // A probe's.
    kinds.push_back(event.kind());
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"session_opened", "session_closed"}));
  watch_ctx.TryCancel();
  watch->Finish();
}

TEST_F(CacheServiceTest, SessionsSeeOnlyTheirNamespace) {
  const std::string a = Open("tenant-a");
  const std::string b = Open("tenant-b");
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(a);
    request.add_items()->set_num_pages(2);
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
    grpc::ClientContext ctx2;
    v1::InsertRequest insert;
    insert.set_session_id(a);
    insert.add_items()->set_tokens(Pack(Seq(0, 8)));
    insert.mutable_items(0)->mutable_pages()->Add(
        allocation.allocations(0).pages().begin(),
        allocation.allocations(0).pages().end());
    v1::InsertResponse inserted;
    ASSERT_TRUE(stub_->Insert(&ctx2, insert, &inserted).ok());
  }
  for (const auto& [session, expected] : {std::pair{a, 8}, std::pair{b, 0}}) {
    grpc::ClientContext ctx;
    v1::MatchPrefixRequest request;
    request.set_session_id(session);
    request.add_items()->set_tokens(Pack(Seq(0, 8)));
    v1::MatchPrefixResponse response;
    ASSERT_TRUE(stub_->MatchPrefix(&ctx, request, &response).ok());
    EXPECT_EQ(response.results(0).device().valid_tokens(), expected);
  }
}

}  // namespace
}  // namespace hicache
