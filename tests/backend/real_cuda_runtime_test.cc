// RealCudaRuntime: checks that need no GPU run everywhere; the rest skip
// unless a GPU is usable (so they are part of every `bazel test //tests/...`
// and skip on CI).
#include "daemon/backend/cuda/real_cuda_runtime.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/backend/page_copy_cases.h"
#include "tests/testing/subprocess.h"

namespace hicache::cuda {
namespace {

using ::testing::HasSubstr;

// Skips unless RealCudaRuntime sees a GPU.
#define REQUIRE_GPU(runtime)                                             \
  do {                                                                   \
    absl::StatusOr<int> devices = (runtime).DeviceCount();               \
    if (!devices.ok()) {                                                 \
      ASSERT_EQ(devices.status().code(), absl::StatusCode::kUnavailable) \
          << devices.status();                                           \
      GTEST_SKIP() << "no CUDA: " << devices.status().message();         \
    }                                                                    \
    if (*devices == 0) GTEST_SKIP() << "no GPU (0 CUDA devices)";        \
  } while (0)

TEST(RealCudaRuntimeBuildTest, DeviceCountMatchesTheBuild) {
  RealCudaRuntime runtime;
  EXPECT_EQ(runtime.name(), "cuda");
  absl::StatusOr<int> count = runtime.DeviceCount();
  if (RealCudaRuntime::CompiledWithCuda()) {
    ASSERT_TRUE(count.ok()) << count.status();  // 0 without a GPU.
    EXPECT_GE(*count, 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(count.status().message(), HasSubstr("built without CUDA"));
    EXPECT_EQ(runtime.CreateStream(0).status().code(),
              absl::StatusCode::kUnavailable);
    EXPECT_EQ(runtime.DeviceMalloc(0, 64).status().code(),
              absl::StatusCode::kUnavailable);
  }
}

TEST(RealCudaRuntimeBuildTest, RejectsBadArgumentsWithoutAGpu) {
  RealCudaRuntime runtime;
  EXPECT_EQ(runtime.SynchronizeStream(nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime.LaunchPageCopy({}, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime.CreateEvent(0, {.interprocess = true, .timing = true})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime.IpcOpenMemHandle(0, "short").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RealCudaRuntimeTest, DescribesTheDevice) {
  RealCudaRuntime runtime;
  REQUIRE_GPU(runtime);
  absl::StatusOr<DeviceInfo> info = runtime.GetDeviceInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->name.empty());
  EXPECT_FALSE(info->pci_bus_id.empty());
  EXPECT_GT(info->total_bytes, 0u);
  EXPECT_LE(info->free_bytes, info->total_bytes);
  EXPECT_GT(info->multiprocessors, 0);
  EXPECT_GE(info->compute_capability, 50);
}

class RealPageCopyTest
    : public ::testing::TestWithParam<testing::PageCopyCase> {};

TEST_P(RealPageCopyTest, CopiesExactlyLikeTheReference) {
  RealCudaRuntime runtime;
  REQUIRE_GPU(runtime);
  testing::CheckPageCopy(runtime, 0, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllRowsAndLayouts, RealPageCopyTest,
                         ::testing::ValuesIn(testing::AllPageCopyCases()),
                         testing::PageCopyCaseName);

TEST(RealCudaRuntimeTest, InvalidRegionsAreRefusedBeforeLaunch) {
  RealCudaRuntime runtime;
  REQUIRE_GPU(runtime);
  absl::StatusOr<void*> descriptors =
      runtime.HostAllocPinned(PackedCopyBytes(1, 1));
  ASSERT_TRUE(descriptors.ok()) << descriptors.status();
  testing::PackDescriptors(
      {CopyRegion{.bytes_per_page = 130, .src_stride = 132, .dst_stride = 132}},
      {0}, {0}, *descriptors);
  absl::StatusOr<void*> device = runtime.DeviceMalloc(0, 4096);
  ASSERT_TRUE(device.ok());
  absl::StatusOr<Stream> stream = runtime.CreateStream(0);
  ASSERT_TRUE(stream.ok());
  BatchedPageCopy copy{.src_base = *device,
                       .dst_base = *device,
                       .descriptors = *descriptors,
                       .num_regions = 1,
                       .num_pages = 1};
  EXPECT_THAT(runtime.LaunchPageCopy(copy, *stream).message(),
              HasSubstr("multiple of 4"));
  EXPECT_TRUE(runtime.SynchronizeStream(*stream).ok());
  EXPECT_TRUE(runtime.DestroyStream(*stream).ok());
  EXPECT_TRUE(runtime.DeviceFree(0, *device).ok());
  EXPECT_TRUE(runtime.HostFreePinned(*descriptors).ok());
}

TEST(RealCudaRuntimeTest, EventsOrderAndTimeWork) {
  RealCudaRuntime runtime;
  REQUIRE_GPU(runtime);
  constexpr size_t kBytes = 64 << 20;
  absl::StatusOr<void*> a = runtime.DeviceMalloc(0, kBytes);
  absl::StatusOr<void*> b = runtime.DeviceMalloc(0, kBytes);
  absl::StatusOr<Stream> s1 = runtime.CreateStream(0);
  absl::StatusOr<Stream> s2 = runtime.CreateStream(0);
  absl::StatusOr<Event> start = runtime.CreateEvent(0, {.timing = true});
  absl::StatusOr<Event> end = runtime.CreateEvent(0, {.timing = true});
  ASSERT_TRUE(a.ok() && b.ok() && s1.ok() && s2.ok() && start.ok() && end.ok());
  ASSERT_TRUE(runtime.Memset(*a, 0x5a, kBytes).ok());
  ASSERT_TRUE(runtime.RecordEvent(*start, *s1).ok());
  ASSERT_TRUE(runtime.MemcpyAsync(*b, *a, kBytes, *s1).ok());
  ASSERT_TRUE(runtime.RecordEvent(*end, *s1).ok());
  // s2 reads b only after s1's copy.
  std::vector<uint8_t> tail(4096);
  absl::StatusOr<void*> pinned = runtime.HostAllocPinned(tail.size());
  ASSERT_TRUE(pinned.ok());
  ASSERT_TRUE(runtime.StreamWaitEvent(*s2, *end).ok());
  ASSERT_TRUE(runtime
                  .MemcpyAsync(*pinned,
                               static_cast<char*>(*b) + kBytes - tail.size(),
                               tail.size(), *s2)
                  .ok());
  ASSERT_TRUE(runtime.SynchronizeStream(*s2).ok());
  EXPECT_TRUE(*runtime.QueryEvent(*end));
  std::memcpy(tail.data(), *pinned, tail.size());
  EXPECT_EQ(tail, std::vector<uint8_t>(tail.size(), 0x5a));
  absl::StatusOr<float> ms = runtime.ElapsedMs(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0.0f);
  for (Event e : {*start, *end}) EXPECT_TRUE(runtime.DestroyEvent(e).ok());
  for (Stream s : {*s1, *s2}) EXPECT_TRUE(runtime.DestroyStream(s).ok());
  EXPECT_TRUE(runtime.HostFreePinned(*pinned).ok());
  EXPECT_TRUE(runtime.DeviceFree(0, *a).ok());
  EXPECT_TRUE(runtime.DeviceFree(0, *b).ok());
}

TEST(RealCudaRuntimeTest, MemcpyBatchAsyncCopiesEveryPiece) {
  RealCudaRuntime runtime;
  REQUIRE_GPU(runtime);
  constexpr size_t kPiece = 656;
  absl::StatusOr<void*> host = runtime.HostAllocPinned(3 * kPiece);
  absl::StatusOr<void*> device = runtime.DeviceMalloc(0, 3 * kPiece);
  absl::StatusOr<Stream> stream = runtime.CreateStream(0);
  ASSERT_TRUE(host.ok() && device.ok() && stream.ok());
  char* h = static_cast<char*>(*host);
  char* d = static_cast<char*>(*device);
  for (size_t i = 0; i < 3 * kPiece; ++i) h[i] = static_cast<char>(i * 7);
  // Pieces reversed: host piece i to device piece 2 - i.
  void* dsts[3] = {d + 2 * kPiece, d + kPiece, d};
  const void* srcs[3] = {h, h + kPiece, h + 2 * kPiece};
  const size_t sizes[3] = {kPiece, kPiece, kPiece};
  absl::Status status = runtime.MemcpyBatchAsync(dsts, srcs, sizes, 3, *stream);
  if (status.code() == absl::StatusCode::kUnimplemented) {
    GTEST_SKIP() << status;
  }
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_TRUE(runtime.SynchronizeStream(*stream).ok());
  std::vector<char> got(3 * kPiece);
  ASSERT_TRUE(runtime.CopyToHost(got.data(), d, got.size()).ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(0, std::memcmp(&got[(2 - i) * kPiece], h + i * kPiece, kPiece))
        << "piece " << i;
  }
  EXPECT_TRUE(runtime.DestroyStream(*stream).ok());
  EXPECT_TRUE(runtime.DeviceFree(0, *device).ok());
  EXPECT_TRUE(runtime.HostFreePinned(*host).ok());
}

// The child half of IpcHandlesWorkAcrossProcesses: waits for the exported
// event, checks the exported memory, then overwrites it.
TEST(RealCudaRuntimeChildTest, UsesExportedHandles) {
  const char* mem = std::getenv("HICACHE_REAL_IPC_MEM");
  const char* event = std::getenv("HICACHE_REAL_IPC_EVENT");
  if (mem == nullptr || event == nullptr) {
    GTEST_SKIP() << "run by IpcHandlesWorkAcrossProcesses";
  }
  RealCudaRuntime runtime;
  absl::StatusOr<Event> alias =
      runtime.IpcOpenEventHandle(0, absl::HexStringToBytes(event));
  ASSERT_TRUE(alias.ok()) << alias.status();
  ASSERT_TRUE(runtime.SynchronizeEvent(*alias).ok());
  absl::StatusOr<void*> mapped =
      runtime.IpcOpenMemHandle(0, absl::HexStringToBytes(mem));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  std::vector<char> bytes(4096);
  ASSERT_TRUE(runtime.CopyToHost(bytes.data(), *mapped, bytes.size()).ok());
  ASSERT_EQ(bytes, std::vector<char>(bytes.size(), 'p'));
  const std::vector<char> reply(bytes.size(), 'c');
  ASSERT_TRUE(runtime.CopyToDevice(*mapped, reply.data(), reply.size()).ok());
  EXPECT_TRUE(runtime.IpcCloseMemHandle(*mapped).ok());
  EXPECT_TRUE(runtime.DestroyEvent(*alias).ok());
}

TEST(RealCudaRuntimeTest, IpcHandlesWorkAcrossProcesses) {
  RealCudaRuntime runtime;
  REQUIRE_GPU(runtime);
  constexpr size_t kBytes = 4096;
  absl::StatusOr<void*> device = runtime.DeviceMalloc(0, kBytes);
  absl::StatusOr<void*> pinned = runtime.HostAllocPinned(kBytes);
  absl::StatusOr<Stream> stream = runtime.CreateStream(0);
  absl::StatusOr<Event> event = runtime.CreateEvent(0, {.interprocess = true});
  ASSERT_TRUE(device.ok() && pinned.ok() && stream.ok() && event.ok());
  std::memset(*pinned, 'p', kBytes);
  ASSERT_TRUE(runtime.MemcpyAsync(*device, *pinned, kBytes, *stream).ok());
  ASSERT_TRUE(runtime.RecordEvent(*event, *stream).ok());
  absl::StatusOr<std::string> mem_handle = runtime.IpcGetMemHandle(*device);
  absl::StatusOr<std::string> event_handle = runtime.IpcGetEventHandle(*event);
  ASSERT_TRUE(mem_handle.ok()) << mem_handle.status();
  ASSERT_TRUE(event_handle.ok()) << event_handle.status();
  EXPECT_EQ(mem_handle->size(), kIpcHandleBytes);
  EXPECT_EQ(event_handle->size(), kIpcHandleBytes);

  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  absl::StatusOr<hicache::testing::Subprocess> child =
      hicache::testing::Subprocess::Start(
          {"/usr/bin/env", "-u", "TEST_PREMATURE_EXIT_FILE", "-u",
           "XML_OUTPUT_FILE",
           absl::StrCat("HICACHE_REAL_IPC_MEM=",
                        absl::BytesToHexString(*mem_handle)),
           absl::StrCat("HICACHE_REAL_IPC_EVENT=",
                        absl::BytesToHexString(*event_handle)),
           self,
           "--gtest_filter=RealCudaRuntimeChildTest.UsesExportedHandles"});
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> exit_code = child->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  ASSERT_EQ(*exit_code, 0) << child->Stdout() << child->Stderr();
  EXPECT_THAT(child->Stdout(),
              HasSubstr("[       OK ] RealCudaRuntimeChildTest"));
  std::vector<char> bytes(kBytes);
  ASSERT_TRUE(runtime.CopyToHost(bytes.data(), *device, kBytes).ok());
  EXPECT_EQ(bytes, std::vector<char>(kBytes, 'c'));

  EXPECT_TRUE(runtime.DestroyEvent(*event).ok());
  EXPECT_TRUE(runtime.DestroyStream(*stream).ok());
  EXPECT_TRUE(runtime.HostFreePinned(*pinned).ok());
  EXPECT_TRUE(runtime.DeviceFree(0, *device).ok());
}

}  // namespace
}  // namespace hicache::cuda
