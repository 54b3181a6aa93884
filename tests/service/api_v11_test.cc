// API v1.1 (issue 12): the answers a scheduler written from the proto and
// the docs alone relies on, each reproduced through a real DaemonServer.
#include <memory>
#include <string>

#include "client/cpp/endpoint.h"
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
    config.operator_uids = {static_cast<uint32_t>(getuid())};
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
    session_ = Open();
  }

  std::string Open() {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("v11");
    request.set_role(v1::ROLE_SCHEDULER);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&ctx, request, &response).ok());
    return response.session_id();
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

}  // namespace
}  // namespace hicache
