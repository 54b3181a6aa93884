// LoadFenceWaiter: clear failures without CUDA, empty fences (backends
// without events) are no-ops, malformed fences are INVALID_ARGUMENT, and a
// well-formed fence on a machine without a GPU fails cleanly, never crashes.
#include "client/cpp/load_fence_waiter.h"

#include <string>

#include "client/cpp/cuda_api.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache::client {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

TEST(LoadFenceWaiterTest, NeedsTheCudaRuntime) {
  auto waiter = LoadFenceWaiter::Create(
      0, absl::FailedPreconditionError("libcudart could not be loaded: test"));
  EXPECT_EQ(waiter.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(waiter.status().message()),
              HasSubstr("libcudart could not be loaded"));
  EXPECT_EQ(LoadFenceWaiter::Create(0, static_cast<const CudaApi*>(nullptr))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadFenceWaiterTest, WaitsOnlyOnWellFormedFences) {
  absl::StatusOr<const CudaApi*> cuda = CudaApi::Get();
  if (!cuda.ok()) GTEST_SKIP() << "no libcudart here: " << cuda.status();
  EXPECT_EQ(LoadFenceWaiter::Create(-1, cuda).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto waiter = LoadFenceWaiter::Create(0, cuda);
  ASSERT_TRUE(waiter.ok()) << waiter.status();
  // The CPU backend's LayerLoaded carries no fence: nothing to wait on.
  EXPECT_TRUE((*waiter)->Wait("", nullptr).ok());
  for (size_t size : {1, 63, 65}) {
    absl::Status bad = (*waiter)->Wait(std::string(size, 'f'), nullptr);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.message()),
                HasSubstr("load fence is " + std::to_string(size) + " bytes"));
  }
  // A zero handle names no event on any machine: an error naming the call.
  absl::Status zero = (*waiter)->Wait(std::string(64, '\0'), nullptr);
  EXPECT_FALSE(zero.ok());
  EXPECT_THAT(std::string(zero.message()),
              ContainsRegex("^cuda[A-Za-z]+(\\([^)]*\\))?: .*\\(CUDA error "
                            "[0-9]+\\)"));
}

}  // namespace
}  // namespace hicache::client
