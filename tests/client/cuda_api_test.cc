// CudaApi: loading libcudart at run time, with clear failures where it is
// absent, and the mapping of CUDA errors to status codes. Runs on machines
// with no CUDA, with a runtime but no GPU, and with a GPU.
#include "client/cpp/cuda_api.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache::client {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CudaApiTest, DefaultCandidatesSearchTheLoaderPathThenCudaLib64) {
  EXPECT_THAT(CudaApi::DefaultCandidates(),
              ::testing::ElementsAre("libcudart.so", "libcudart.so.13",
                                     "libcudart.so.12",
                                     "/usr/local/cuda/lib64/libcudart.so",
                                     "/usr/local/cuda/lib64/libcudart.so.13",
                                     "/usr/local/cuda/lib64/libcudart.so.12"));
}

TEST(CudaApiTest, MissingLibraryIsFailedPreconditionNamingEachCandidate) {
  auto api = CudaApi::Load({"/nonexistent/libcudart.so", "libnope.so.12"});
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(api.status().message()),
              StartsWith("libcudart could not be loaded: "));
  EXPECT_THAT(std::string(api.status().message()),
              HasSubstr("/nonexistent/libcudart.so"));
  EXPECT_THAT(std::string(api.status().message()), HasSubstr("libnope.so.12"));
  EXPECT_EQ(CudaApi::Load({}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CudaApiTest, LibraryWithoutTheSymbolsIsRefused) {
  auto api = CudaApi::Load({"libc.so.6"});
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(api.status().message()),
              HasSubstr("libc.so.6: no symbol cudaSetDevice"));
}

TEST(CudaApiTest, IpcHandlesAreExactly64Bytes) {
  auto ok = ToIpcHandle(std::string(64, '\x7f'), "fence");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->bytes[63], '\x7f');
  for (size_t size : {0, 1, 63, 65, 128}) {
    auto bad = ToIpcHandle(std::string(size, 'x'), "fence");
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()),
                HasSubstr("fence is " + std::to_string(size) + " bytes"));
  }
}

// The process-wide runtime either loads or says why; with it, errors map to
// codes and calls fail cleanly where there is no GPU.
TEST(CudaApiTest, ProcessRuntimeLoadsOrExplainsWhy) {
  absl::StatusOr<const CudaApi*> api = CudaApi::Get();
  EXPECT_EQ(CudaApi::Get().status(), api.status());  // Loaded once.
  if (!api.ok()) {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(api.status().message()),
                StartsWith("libcudart could not be loaded: "));
    GTEST_SKIP() << "no libcudart here: " << api.status();
  }
  const CudaApi& cuda = **api;
  EXPECT_TRUE(cuda.Error(0, "cudaX").ok());
  absl::Status driver = cuda.Error(35, "cudaSetDevice(0)");
  EXPECT_EQ(driver.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(driver.message()), StartsWith("cudaSetDevice(0): "));
  EXPECT_THAT(std::string(driver.message()), HasSubstr("(CUDA error 35)"));
  EXPECT_EQ(cuda.Error(100, "c").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cuda.Error(2, "c").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cuda.Error(1, "c").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.Error(400, "c").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda.Error(999, "c").code(), absl::StatusCode::kInternal);

  // No bus id: the ordinal, without asking CUDA.
  EXPECT_EQ(*cuda.FindDevice("", 3), 3);
  EXPECT_EQ(cuda.FindDevice("", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A bus id: found, or the ordinal where it is not visible, or (no GPU or
  // driver here) an error naming the call.
  absl::StatusOr<int> found = cuda.FindDevice("0000:19:00.0", 0);
  if (!found.ok()) {
    EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(found.status().message()),
                StartsWith("cudaDeviceGetByPCIBusId(0000:19:00.0): "));
  }
  // OnDevice runs the function only once the device is current.
  bool ran = false;
  absl::Status on = cuda.OnDevice(0, [&] {
    ran = true;
    return absl::OkStatus();
  });
  if (on.ok()) {
    EXPECT_TRUE(ran);
  } else {
    EXPECT_FALSE(ran);
    EXPECT_THAT(
        std::string(on.message()),
        AnyOf(StartsWith("cudaGetDevice: "), StartsWith("cudaSetDevice(0): ")));
  }
}

}  // namespace
}  // namespace hicache::client
