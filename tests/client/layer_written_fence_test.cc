// LayerWrittenFence: clear failures without CUDA or a GPU; with a GPU, a
// 64-byte IPC handle and records on the default stream.
#include "client/cpp/layer_written_fence.h"

#include "client/cpp/cuda_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TEST(LayerWrittenFenceTest, NeedsTheCudaRuntime) {
  auto fence = LayerWrittenFence::Create(
      0, absl::FailedPreconditionError("libcudart could not be loaded: test"));
  EXPECT_EQ(fence.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(fence.status().message()),
              HasSubstr("libcudart could not be loaded"));
  EXPECT_EQ(LayerWrittenFence::Create(0, static_cast<const CudaApi*>(nullptr))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LayerWrittenFenceTest, CreatesAnInterprocessEventOrSaysWhyNot) {
  absl::StatusOr<const CudaApi*> cuda = CudaApi::Get();
  if (!cuda.ok()) GTEST_SKIP() << "no libcudart here: " << cuda.status();
  EXPECT_EQ(LayerWrittenFence::Create(-1, cuda).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto fence = LayerWrittenFence::Create(0, cuda);
  if (!fence.ok()) {
    // A runtime without a GPU or driver: an error naming the call.
    EXPECT_EQ(fence.status().code(), absl::StatusCode::kFailedPrecondition)
        << fence.status();
    EXPECT_THAT(std::string(fence.status().message()),
                ContainsRegex("^cuda[A-Za-z]+(\\([^)]*\\))?: .*\\(CUDA error "
                              "[0-9]+\\)"));
    return;
  }
  EXPECT_EQ((*fence)->handle().size(), kCudaIpcHandleBytes);
  EXPECT_EQ((*fence)->device(), 0);
  EXPECT_TRUE((*fence)->Record(nullptr).ok());
}

}  // namespace
}  // namespace hicache::client
