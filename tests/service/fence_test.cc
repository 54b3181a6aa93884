// Worker fences through a real DaemonServer with the CUDA backend on the
// simulated runtime (in-process, so simulated IPC events open): who may
// register, name and release a fence, and what a careless or hostile client
// gets for everything else.
#include <memory>
#include <string>

#include "client/cpp/endpoint.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

class FenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.backend = BackendKind::kCuda;
    config.cuda_runtime = "simulated";
    config.page_size = 4;
    config.cp_size = 2;
    config.device_pages_per_rank = 8;
    config.host_pages_per_rank = 16;
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
    worker_stream_ = *runtime_.CreateStream(0);
  }
  void TearDown() override { (void)runtime_.DestroyStream(worker_stream_); }

  std::string Open(const std::string& ns, v1::Role role = v1::ROLE_SCHEDULER) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("fence-test");
    request.set_role(role);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&ctx, request, &response).ok());
    return response.session_id();
  }

  // A worker's "layer written" event, exported.
  std::string NewEventHandle() {
    cuda::Event event = *runtime_.CreateEvent(0, {.interprocess = true});
    EXPECT_TRUE(runtime_.RecordEvent(event, worker_stream_).ok());
    return *runtime_.IpcGetEventHandle(event);
  }

  grpc::Status Register(const std::string& session, uint32_t rank,
                        const std::string& handle, uint64_t* fence) {
    grpc::ClientContext ctx;
    v1::RegisterFenceRequest request;
    request.set_session_id(session);
    request.set_rank(rank);
    request.set_event_handle(handle);
    v1::RegisterFenceResponse response;
    grpc::Status status = stub_->RegisterFence(&ctx, request, &response);
    if (fence != nullptr) *fence = response.fence_id();
    return status;
  }

  grpc::Status Release(const std::string& session, uint64_t fence) {
    grpc::ClientContext ctx;
    v1::ReleaseFenceRequest request;
    request.set_session_id(session);
    request.set_fence_id(fence);
    v1::ReleaseFenceResponse response;
    return stub_->ReleaseFence(&ctx, request, &response);
  }

  // One backup stream message naming `fence` for rank 0; the first reply.
  v1::BackupServerMessage StoreWithFence(const std::string& session,
                                         uint64_t fence) {
    v1::AllocateResponse allocation;
    {
      grpc::ClientContext ctx;
      v1::AllocateRequest request;
      request.set_session_id(session);
      v1::AllocateItem* item = request.add_items();
      item->add_owners(0);
      EXPECT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
    }
    grpc::ClientContext ctx;
    auto stream = stub_->BackupSession(&ctx);
    v1::BackupClientMessage prepare;
    prepare.set_session_id(session);
    v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
    spec->add_pages(allocation.allocations(0).pages(0));
    spec->set_logical_tokens(4);
    EXPECT_TRUE(stream->Write(prepare));
    v1::BackupServerMessage reply;
    EXPECT_TRUE(stream->Read(&reply));
    v1::BackupClientMessage stored;
    stored.mutable_layer_stored()->add_backup_ids(
        reply.prepared().backup_ids(0));
    stored.mutable_layer_stored()->set_step(0);
    v1::RankFence* named = stored.mutable_layer_stored()->add_fences();
    named->set_rank(0);
    named->set_fence_id(fence);
    EXPECT_TRUE(stream->Write(stored));
    EXPECT_TRUE(stream->Read(&reply));
    stream->WritesDone();
    v1::BackupServerMessage rest;
    while (stream->Read(&rest)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
    return reply;
  }

  cuda::SimCudaRuntime runtime_{cuda::SimOptions{.devices = 2}};
  cuda::Stream worker_stream_ = nullptr;
  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

TEST_F(FenceTest, LayoutAnnouncesIpcPoolsAndFences) {
  grpc::ClientContext ctx;
  v1::GetLayoutResponse layout;
  ASSERT_TRUE(stub_->GetLayout(&ctx, v1::GetLayoutRequest(), &layout).ok());
  EXPECT_TRUE(layout.fences());
  EXPECT_EQ(layout.backend(), "cuda (simulated)");
  for (const v1::RankSegments& rank : layout.ranks()) {
    EXPECT_EQ(rank.device().kind(), "cuda_ipc");
    EXPECT_EQ(rank.device().ipc_handle().size(), cuda::kIpcHandleBytes);
    EXPECT_EQ(rank.device().device(), static_cast<int>(rank.rank()));
    EXPECT_FALSE(rank.device().pci_bus_id().empty());
    EXPECT_EQ(rank.host().kind(), "shm");
  }
}

TEST_F(FenceTest, WorkersRegisterAndReleaseTheirOwnFences) {
  const std::string worker = Open("", v1::ROLE_WORKER);
  const std::string other = Open("");
  uint64_t fence = 0;
  ASSERT_TRUE(Register(worker, 1, NewEventHandle(), &fence).ok());
  EXPECT_NE(fence, 0u);
  // Only the session that registered a fence releases it, once.
  EXPECT_EQ(Release(other, fence).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Release(worker, fence).ok());
  EXPECT_EQ(Release(worker, fence).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(FenceTest, MalformedRegistrationsChangeNothing) {
  const std::string session = Open("");
  EXPECT_EQ(Register(session, 0, std::string(64, 'x'), nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // Not an event handle.
  EXPECT_EQ(Register(session, 0, std::string(65, 'x'), nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Register(session, 7, NewEventHandle(), nullptr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);  // No such rank here.
  EXPECT_EQ(Register("no-such-session", 0, NewEventHandle(), nullptr)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  // A bounded number per session.
  for (int i = 0; i < 64; ++i) {
    ASSERT_TRUE(Register(session, i % 2, NewEventHandle(), nullptr).ok()) << i;
  }
  grpc::Status status = Register(session, 0, NewEventHandle(), nullptr);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("64 fences"));
}

TEST_F(FenceTest, FencesAreConfinedToTheirNamespace) {
  const std::string tenant_a = Open("a");
  const std::string tenant_b = Open("b");
  uint64_t fence = 0;
  ASSERT_TRUE(Register(tenant_a, 0, NewEventHandle(), &fence).ok());
  const v1::BackupServerMessage refused = StoreWithFence(tenant_b, fence);
  ASSERT_TRUE(refused.has_error()) << refused.DebugString();
  EXPECT_EQ(refused.error().code(),
            static_cast<int>(absl::StatusCode::kNotFound));
  // Its own namespace may name it: the step is copied after the fence.
  const v1::BackupServerMessage accepted = StoreWithFence(tenant_a, fence);
  EXPECT_TRUE(accepted.has_step_done()) << accepted.DebugString();
}

TEST_F(FenceTest, ClosingASessionReleasesItsFences) {
  const std::string worker = Open("", v1::ROLE_WORKER);
  const std::string scheduler = Open("");
  uint64_t fence = 0;
  ASSERT_TRUE(Register(worker, 0, NewEventHandle(), &fence).ok());
  grpc::ClientContext ctx;
  v1::CloseSessionRequest close;
  close.set_session_id(worker);
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(stub_->CloseSession(&ctx, close, &closed).ok());
  const v1::BackupServerMessage refused = StoreWithFence(scheduler, fence);
  ASSERT_TRUE(refused.has_error()) << refused.DebugString();
  EXPECT_EQ(refused.error().code(),
            static_cast<int>(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace hicache
