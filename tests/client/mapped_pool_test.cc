// MappedPool: the shm pools of a real in-process daemon, mapped and addressed
// by the layout's block addresses; cuda_ipc pools fail cleanly (and without
// crashing) where CUDA or a GPU is absent; malformed segments are refused.
#include "client/cpp/mapped_pool.h"

#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "client/cpp/cuda_api.h"
#include "client/cpp/endpoint.h"
#include "daemon/main/daemon_server.h"
#include "daemon/pool/kv_geometry.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace hicache::client {
namespace {

using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kDevicePages = 8;
constexpr int64_t kHostPages = 16;

class MappedPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonConfig config;
    config.page_size = 4;
    config.cp_size = 2;
    config.device_pages_per_rank = kDevicePages;
    config.host_pages_per_rank = kHostPages;
    config.kv_preset = "tiny-draft";
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto stub = v1::HiCache::NewStub(grpc::CreateChannel(
        UnixTarget(socket_), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetLayout(&ctx, v1::GetLayoutRequest(), &layout_).ok());
    ASSERT_EQ(layout_.ranks_size(), 2);
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server_;
  v1::GetLayoutResponse layout_;
};

TEST_F(MappedPoolTest, MapsShmPoolsAtTheLayoutsByteAddresses) {
  const KvGeometry geometry = *KvGeometry::Preset("tiny-draft", 4);
  for (const v1::RankSegments& rank : layout_.ranks()) {
    auto device = MappedPool::Map(rank.device());
    ASSERT_TRUE(device.ok()) << device.status();
    auto host = MappedPool::Map(rank.host());
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ((*device)->kind(), MappedPool::Kind::kShm);
    EXPECT_EQ((*device)->size(), rank.device().size_bytes());
    EXPECT_EQ((*device)->name(), rank.device().name());
    EXPECT_EQ((*device)->device(), -1);
    EXPECT_EQ((*host)->size(), rank.host().size_bytes());
    // Block addresses agree with the daemon's geometry, page by page.
    ASSERT_EQ(layout_.device_blocks_size(), 3);  // kv x2 layers, draft x1.
    for (const v1::BlockAddress& block : layout_.device_blocks()) {
      for (int64_t page = 0; page < kDevicePages; ++page) {
        auto data = (*device)->BlockData(block, page);
        ASSERT_TRUE(data.ok()) << data.status();
        EXPECT_EQ(*data,
                  (*device)->data() + geometry.DeviceOffset(kDevicePages, page,
                                                            block.family(),
                                                            block.layer()));
      }
      // Bounded by the pool (PoolMapping also bounds by the page count).
      EXPECT_EQ((*device)->BlockData(block, 1000).status().code(),
                absl::StatusCode::kOutOfRange);
    }
    for (const v1::BlockAddress& block : layout_.host_blocks()) {
      for (int64_t page = 0; page < kHostPages; ++page) {
        auto data = (*host)->BlockData(block, page);
        ASSERT_TRUE(data.ok()) << data.status();
        EXPECT_EQ(*data,
                  (*host)->data() +
                      geometry.HostOffset(HostLayout::kLayerFirst, kHostPages,
                                          page, block.family(), block.layer()));
      }
    }
    // The mapping is shared: bytes written through one mapping are there
    // through another, at the same address.
    auto again = MappedPool::Map(rank.device());
    ASSERT_TRUE(again.ok());
    const v1::BlockAddress& last = layout_.device_blocks(2);
    std::memset(*(*device)->BlockData(last, 5), 0xA5, last.block_bytes());
    const uint8_t* seen = *(*again)->BlockData(last, 5);
    EXPECT_EQ(seen[0], 0xA5);
    EXPECT_EQ(seen[last.block_bytes() - 1], 0xA5);
  }
}

TEST_F(MappedPoolTest, MalformedSegmentsAreRefused) {
  v1::PoolSegment segment = layout_.ranks(0).device();
  segment.set_kind("rdma");
  auto kind = MappedPool::Map(segment);
  EXPECT_EQ(kind.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(kind.status().message()), HasSubstr("kind 'rdma'"));

  segment = layout_.ranks(0).device();
  segment.set_size_bytes(0);
  EXPECT_EQ(MappedPool::Map(segment).status().code(),
            absl::StatusCode::kInvalidArgument);

  segment = layout_.ranks(0).device();
  segment.set_name("/hicache-no-such-segment");
  auto missing = MappedPool::Map(segment);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("shm_open /hicache-no-such-segment"));

  // A cuda_ipc handle that is not 64 bytes: INVALID_ARGUMENT, with or
  // without CUDA, before CUDA is consulted.
  v1::PoolSegment gpu;
  gpu.set_kind("cuda_ipc");
  gpu.set_name("cuda:0:rank0");
  gpu.set_size_bytes(1 << 20);
  for (size_t size : {0, 63, 65}) {
    gpu.set_ipc_handle(std::string(size, 'h'));
    for (auto cuda : {CudaApi::Get(), absl::StatusOr<const CudaApi*>(
                                          absl::FailedPreconditionError(
                                              "libcudart could not be loaded: "
                                              "test"))}) {
      auto mapped = MappedPool::Map(gpu, cuda);
      EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(
          std::string(mapped.status().message()),
          HasSubstr("ipc_handle is " + std::to_string(size) + " bytes"));
    }
  }
}

v1::PoolSegment GpuSegment() {
  v1::PoolSegment gpu;
  gpu.set_kind("cuda_ipc");
  gpu.set_name("cuda:0:rank0");
  gpu.set_size_bytes(1 << 20);
  gpu.set_ipc_handle(std::string(64, '\0'));
  gpu.set_device(0);
  gpu.set_pci_bus_id("0000:19:00.0");
  return gpu;
}

TEST(MappedPoolCudaTest, GpuPoolWithoutLibcudartIsAClearFailedPrecondition) {
  auto missing = CudaApi::Load({"/nonexistent/libcudart.so"});
  ASSERT_FALSE(missing.ok());
  auto mapped = MappedPool::Map(GpuSegment(), missing.status());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mapped.status().message()),
              StartsWith("this pool is GPU memory (cuda_ipc) and libcudart "
                         "could not be loaded: "));
  EXPECT_THAT(std::string(mapped.status().message()),
              HasSubstr("/nonexistent/libcudart.so"));
  EXPECT_THAT(std::string(mapped.status().message()),
              HasSubstr("PCI 0000:19:00.0"));
  EXPECT_THAT(
      std::string(mapped.status().message()),
      HasSubstr("; run the worker on the GPU node with CUDA installed"));
}

// With this machine's own CUDA (none, a runtime without a GPU, or a GPU):
// never a crash, always an error that says what failed. A zero handle is
// invalid even on a GPU.
TEST(MappedPoolCudaTest, GpuPoolWithThisMachinesCudaFailsCleanly) {
  for (const std::string& bus_id :
       {std::string("0000:19:00.0"), std::string()}) {
    v1::PoolSegment segment = GpuSegment();
    segment.set_pci_bus_id(bus_id);
    auto mapped = MappedPool::Map(segment);
    ASSERT_FALSE(mapped.ok());
    std::cerr << "bus id '" << bus_id << "': " << mapped.status() << "\n";
    EXPECT_THAT(std::string(mapped.status().message()),
                StartsWith("this pool is GPU memory (cuda_ipc) and "));
    EXPECT_THAT(std::string(mapped.status().message()),
                AnyOf(HasSubstr("libcudart could not be loaded: "),
                      ContainsRegex("cuda[A-Za-z]+(\\([^)]*\\))?: .*\\(CUDA "
                                    "error [0-9]+\\)")));
    if (mapped.status().code() == absl::StatusCode::kFailedPrecondition) {
      EXPECT_THAT(std::string(mapped.status().message()),
                  HasSubstr("run the worker on the GPU node with CUDA "
                            "installed"));
    }
  }
}

}  // namespace
}  // namespace hicache::client
