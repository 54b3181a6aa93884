// PoolMapping against a real in-process daemon (CPU backend, C = 2): KV
// written through the device mappings at the layout's addresses is found by
// the daemon's own copies at the host pools' addresses after a backup, and
// back at the device addresses after eviction and load-back, for both host
// layouts. Unserved ranks and unmappable pools fail without leaving maps.
#include "client/cpp/pool_mapping.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/cpp/cuda_api.h"
#include "client/cpp/endpoint.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache::client {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kCp = 2;
constexpr uint32_t kPageSize = 4;

uint8_t Pattern(int position, uint32_t family, uint32_t layer, uint64_t byte) {
  return static_cast<uint8_t>(position * 131 + family * 31 + layer * 7 +
                              byte * 13 + 1);
}

class PoolMappingTest : public ::testing::TestWithParam<HostLayout> {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.page_size = kPageSize;
    config.cp_size = kCp;
    config.device_pages_per_rank = 8;
    config.host_pages_per_rank = 16;
    config.kv_preset = "tiny-draft";
    config.host_layout = GetParam();
    config.operator_uids = {static_cast<uint32_t>(getuid())};
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        UnixTarget(socket_), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetLayout(&ctx, v1::GetLayoutRequest(), &layout_).ok());
  }

  // Calls `visit(family, layer, position, block)` for every device block
  // of the request's pages that rank `rank` owns.
  template <typename Visit>
  void ForEachDeviceBlock(const PoolMapping& pools,
                          const std::vector<int64_t>& pages, Visit visit) {
    for (int position = 0; position < static_cast<int>(pages.size());
         ++position) {
      if (pages[position] % kCp != pools.rank()) continue;
      for (const v1::BlockAddress& b : layout_.device_blocks()) {
        auto block =
            pools.DeviceBlock(b.family(), b.layer(), pages[position] / kCp);
        ASSERT_TRUE(block.ok()) << block.status();
        visit(b, position, *block);
      }
    }
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
  v1::GetLayoutResponse layout_;
};

TEST_P(PoolMappingTest, BytesTravelBetweenTheLayoutsAddresses) {
  std::vector<std::unique_ptr<PoolMapping>> pools;
  for (uint32_t rank = 0; rank < kCp; ++rank) {
    auto mapped = PoolMapping::Map(layout_, rank);
    ASSERT_TRUE(mapped.ok()) << mapped.status();
    ASSERT_NE((*mapped)->device(), nullptr);
    ASSERT_NE((*mapped)->host(), nullptr);
    EXPECT_EQ((*mapped)->rank(), rank);
    pools.push_back(*std::move(mapped));
  }
  // A scheduler allocates 4 pages over both lanes; "workers" write them.
  grpc::ClientContext open_ctx;
  v1::OpenSessionRequest open;
  open.set_client_name("pool-mapping-test");
  open.set_role(v1::ROLE_SCHEDULER);
  v1::OpenSessionResponse session;
  ASSERT_TRUE(stub_->OpenSession(&open_ctx, open, &session).ok());
  v1::AllocateResponse allocation;
  {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session.session_id());
    v1::AllocateItem* item = request.add_items();
    for (uint32_t owner : {0u, 1u, 0u, 1u}) item->add_owners(owner);
    ASSERT_TRUE(stub_->Allocate(&ctx, request, &allocation).ok());
  }
  const std::vector<int64_t> pages(allocation.allocations(0).pages().begin(),
                                   allocation.allocations(0).pages().end());
  ASSERT_EQ(pages.size(), 4u);
  for (const auto& p : pools) {
    ForEachDeviceBlock(
        *p, pages,
        [&](const v1::BlockAddress& b, int position, uint8_t* block) {
          for (uint64_t i = 0; i < b.block_bytes(); ++i) {
            block[i] = Pattern(position, b.family(), b.layer(), i);
          }
        });
  }
  // Back the request up to host (every step), cache it, wait for commit.
  grpc::ClientContext backup_ctx;
  auto stream = stub_->BackupSession(&backup_ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id(session.session_id());
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->mutable_pages()->Add(pages.begin(), pages.end());
  spec->set_logical_tokens(pages.size() * kPageSize);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_prepared()) << reply.DebugString();
  const uint64_t backup = reply.prepared().backup_ids(0);
  ASSERT_NE(backup, 0u);
  for (uint32_t step = 0; step < layout_.num_steps(); ++step) {
    v1::BackupClientMessage stored;
    stored.set_session_id(session.session_id());
    stored.mutable_layer_stored()->add_backup_ids(backup);
    stored.mutable_layer_stored()->set_step(step);
    ASSERT_TRUE(stream->Write(stored));
  }
  const std::vector<int32_t> tokens = testing::Seq(0, pages.size() * kPageSize);
  v1::InsertResponse inserted;
  {
    grpc::ClientContext ctx;
    v1::InsertRequest request;
    request.set_session_id(session.session_id());
    v1::InsertItem* item = request.add_items();
    item->set_tokens(testing::Pack(tokens));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->set_backup_id(backup);
    ASSERT_TRUE(stub_->Insert(&ctx, request, &inserted).ok());
  }
  ASSERT_TRUE(inserted.results(0).backup_attached());
  bool committed = false;
  while (!committed && stream->Read(&reply)) committed = reply.has_committed();
  ASSERT_TRUE(committed);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  // The host copies sit at the host blocks' addresses of the host pages
  // the daemon reports (per rank, in the order of that rank's pages).
  v1::NodeInfo node;
  {
    grpc::ClientContext ctx;
    v1::InspectNodeRequest request;
    request.set_node(inserted.results(0).node());
    ASSERT_TRUE(stub_->InspectNode(&ctx, request, &node).ok());
  }
  ASSERT_EQ(node.host_pages_by_rank_size(), static_cast<int>(kCp));
  for (const auto& p : pools) {
    const auto& host_pages = node.host_pages_by_rank(p->rank()).pages();
    int owned = 0;
    for (int position = 0; position < static_cast<int>(pages.size());
         ++position) {
      if (pages[position] % kCp != p->rank()) continue;
      ASSERT_LT(owned, host_pages.size());
      const int64_t host_page = host_pages[owned++];
      for (const v1::BlockAddress& b : layout_.host_blocks()) {
        auto block = p->HostBlock(b.family(), b.layer(), host_page);
        ASSERT_TRUE(block.ok()) << block.status();
        for (uint64_t i = 0; i < b.block_bytes(); ++i) {
          ASSERT_EQ((*block)[i], Pattern(position, b.family(), b.layer(), i))
              << "rank " << p->rank() << " position " << position << " family "
              << b.family() << " layer " << b.layer() << " byte " << i;
        }
      }
    }
    EXPECT_EQ(owned, host_pages.size());
  }

  // Evict the device copies, load back into fresh pages, read them there.
  for (const auto& p : pools) {
    ForEachDeviceBlock(*p, pages,
                       [&](const v1::BlockAddress& b, int, uint8_t* block) {
                         std::memset(block, 0, b.block_bytes());
                       });
  }
  {
    grpc::ClientContext ctx;
    v1::EvictRequest request;
    request.add_device_pages_per_lane(7);
    request.add_device_pages_per_lane(7);
    v1::EvictResponse response;
    ASSERT_TRUE(stub_->Evict(&ctx, request, &response).ok());
    EXPECT_EQ(response.device_pages_freed(), 4);
  }
  grpc::ClientContext load_ctx;
  v1::LoadBackRequest load_request;
  load_request.set_session_id(session.session_id());
  load_request.set_tokens(testing::Pack(tokens));
  auto load = stub_->LoadBack(&load_ctx, load_request);
  v1::LoadBackEvent event;
  ASSERT_TRUE(load->Read(&event));
  ASSERT_TRUE(event.has_started()) << event.DebugString();
  const std::vector<int64_t> loaded(event.started().locations().pages().begin(),
                                    event.started().locations().pages().end());
  ASSERT_EQ(loaded.size(), pages.size());
  bool done = false;
  while (load->Read(&event)) {
    if (event.has_layer_loaded()) {
      EXPECT_TRUE(event.layer_loaded().fence().empty());  // CPU backend.
    }
    if (event.has_done()) done = event.done().ok();
  }
  EXPECT_TRUE(load->Finish().ok());
  ASSERT_TRUE(done);
  for (const auto& p : pools) {
    ForEachDeviceBlock(
        *p, loaded,
        [&](const v1::BlockAddress& b, int position, uint8_t* block) {
          for (uint64_t i = 0; i < b.block_bytes(); ++i) {
            ASSERT_EQ(block[i], Pattern(position, b.family(), b.layer(), i))
                << "rank " << p->rank() << " position " << position;
          }
        });
  }
}

TEST_P(PoolMappingTest, LookupsFailClearly) {
  auto unserved = PoolMapping::Map(layout_, 5);
  EXPECT_EQ(unserved.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unserved.status().message()), HasSubstr("rank 5"));

  auto pools = PoolMapping::Map(layout_, 1);
  ASSERT_TRUE(pools.ok()) << pools.status();
  EXPECT_EQ((*pools)->DeviceBlock(0, 9, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*pools)->DeviceBlock(0, 0, 8).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*pools)->HostBlock(1, 0, 16).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE((*pools)->HostBlock(1, 0, 15).ok());

  // A layout naming no host pool maps the device pool alone.
  v1::GetLayoutResponse device_only = layout_;
  device_only.mutable_ranks(1)->clear_host();
  auto alone = PoolMapping::Map(device_only, 1);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ((*alone)->host(), nullptr);
  EXPECT_EQ((*alone)->HostBlock(0, 0, 0).status().code(),
            absl::StatusCode::kNotFound);
}

// A GPU device pool where CUDA is absent fails the whole mapping with the
// pool's error (nothing of the rank stays mapped).
TEST_P(PoolMappingTest, GpuPoolWithoutCudaFailsTheMapping) {
  v1::GetLayoutResponse gpu = layout_;
  v1::PoolSegment* device = gpu.mutable_ranks(0)->mutable_device();
  device->set_kind("cuda_ipc");
  device->set_ipc_handle(std::string(64, '\0'));
  device->set_device(0);
  auto mapped = PoolMapping::Map(
      gpu, 0,
      absl::FailedPreconditionError("libcudart could not be loaded: test"));
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mapped.status().message()),
              HasSubstr("this pool is GPU memory (cuda_ipc) and libcudart "
                        "could not be loaded: test"));
  // Rank 1 (still shm) maps even so.
  EXPECT_TRUE(PoolMapping::Map(gpu, 1).ok());
}

INSTANTIATE_TEST_SUITE_P(HostLayouts, PoolMappingTest,
                         ::testing::Values(HostLayout::kLayerFirst,
                                           HostLayout::kPageFirst),
                         [](const auto& info) {
                           return info.param == HostLayout::kLayerFirst
                                      ? std::string("LayerFirst")
                                      : std::string("PageFirst");
                         });

}  // namespace
}  // namespace hicache::client
