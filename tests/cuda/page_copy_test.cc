// Tests of the CUDA kernels' host API. The header must compile in every build;
// validation runs everywhere; tests that need a GPU skip cleanly without one.
#include "hicache/cuda_kernels/page_copy.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache::cuda {
namespace {

using ::testing::HasSubstr;

PageCopy ValidCopy() {
  static int64_t pages[1] = {0};
  static uint32_t buffer[2][164];
  return PageCopy{.src = buffer[0],
                  .dst = buffer[1],
                  .src_pages = pages,
                  .dst_pages = pages,
                  .num_pages = 1,
                  .bytes_per_page = 656,
                  .src_stride_bytes = 656,
                  .dst_stride_bytes = 656};
}

TEST(PageCopyValidationTest, AcceptsFp8RowsAndIndexerRows) {
  EXPECT_TRUE(ValidatePageCopy(ValidCopy()).ok());
  PageCopy copy = ValidCopy();
  copy.bytes_per_page = copy.src_stride_bytes = copy.dst_stride_bytes = 132;
  EXPECT_TRUE(ValidatePageCopy(copy).ok());
}

TEST(PageCopyValidationTest, RejectsBadSizesWithClearMessages) {
  PageCopy copy = ValidCopy();
  copy.bytes_per_page = 654;
  EXPECT_THAT(ValidatePageCopy(copy).message(), HasSubstr("multiple of 4"));
  copy = ValidCopy();
  copy.src_stride_bytes = 652;
  EXPECT_THAT(ValidatePageCopy(copy).message(), HasSubstr("src_stride_bytes"));
  copy = ValidCopy();
  copy.num_pages = -1;
  EXPECT_THAT(ValidatePageCopy(copy).message(), HasSubstr("num_pages"));
  copy = ValidCopy();
  copy.dst_pages = nullptr;
  EXPECT_EQ(ValidatePageCopy(copy).code(), absl::StatusCode::kInvalidArgument);
  copy = ValidCopy();
  copy.src = static_cast<const char*>(copy.src) + 2;
  EXPECT_THAT(ValidatePageCopy(copy).message(), HasSubstr("aligned"));
}

TEST(PageCopyValidationTest, EmptyCopyNeedsNoPointers) {
  PageCopy copy;
  copy.bytes_per_page = copy.src_stride_bytes = copy.dst_stride_bytes = 4;
  EXPECT_TRUE(ValidatePageCopy(copy).ok());
}

TEST(PageCopyBuildTest, DeviceCountMatchesBuild) {
  absl::StatusOr<int> count = VisibleDeviceCount();
  if (CompiledWithCuda()) {
    ASSERT_TRUE(count.ok()) << count.status();
    EXPECT_GE(*count, 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(LaunchPageCopy(ValidCopy(), nullptr).code(),
              absl::StatusCode::kUnavailable);
  }
}

// Skips unless a GPU is usable.
#define REQUIRE_GPU()                                               \
  do {                                                              \
    absl::StatusOr<int> devices = VisibleDeviceCount();             \
    if (!devices.ok() || *devices == 0) {                           \
      GTEST_SKIP() << "no GPU: "                                    \
                   << (devices.ok() ? "0 devices"                   \
                                    : devices.status().ToString()); \
    }                                                               \
  } while (0)

class PageCopyGpuTest : public ::testing::TestWithParam<int64_t> {};

// Scatters pages through the kernel and checks every byte, for the row sizes
// of every KV family (bf16 MLA 1152, FP8 MLA 656, indexer 132) times P = 4.
TEST_P(PageCopyGpuTest, GathersAndScattersPagesExactly) {
  REQUIRE_GPU();
  const int64_t page_bytes = GetParam();
  const int64_t stride = page_bytes + 4;  // Not 16-aligned for 132-byte rows.
  constexpr int64_t kPages = 37;
  std::vector<uint8_t> src(kPages * stride);
  std::iota(src.begin(), src.end(), 1);
  std::vector<int64_t> src_pages(kPages), dst_pages(kPages);
  for (int64_t i = 0; i < kPages; ++i) {
    src_pages[i] = i;
    dst_pages[i] = (i * 7) % kPages;  // A permutation.
  }
  auto d_src = DeviceAlloc(src.size());
  auto d_dst = DeviceAlloc(src.size());
  auto d_sp = DeviceAlloc(kPages * sizeof(int64_t));
  auto d_dp = DeviceAlloc(kPages * sizeof(int64_t));
  ASSERT_TRUE(d_src.ok() && d_dst.ok() && d_sp.ok() && d_dp.ok());
  ASSERT_TRUE(CopyToDevice(*d_src, src.data(), src.size()).ok());
  ASSERT_TRUE(CopyToDevice(*d_sp, src_pages.data(), kPages * 8).ok());
  ASSERT_TRUE(CopyToDevice(*d_dp, dst_pages.data(), kPages * 8).ok());
  PageCopy copy{.src = *d_src,
                .dst = *d_dst,
                .src_pages = static_cast<int64_t*>(*d_sp),
                .dst_pages = static_cast<int64_t*>(*d_dp),
                .num_pages = kPages,
                .bytes_per_page = page_bytes,
                .src_stride_bytes = stride,
                .dst_stride_bytes = stride};
  ASSERT_TRUE(LaunchPageCopy(copy, nullptr).ok());
  ASSERT_TRUE(SynchronizeStream(nullptr).ok());
  std::vector<uint8_t> dst(src.size());
  ASSERT_TRUE(CopyToHost(dst.data(), *d_dst, dst.size()).ok());
  for (int64_t i = 0; i < kPages; ++i) {
    for (int64_t b = 0; b < page_bytes; ++b) {
      ASSERT_EQ(dst[dst_pages[i] * stride + b], src[i * stride + b])
          << "page " << i << " byte " << b;
    }
  }
  for (void* p : {*d_src, *d_dst, *d_sp, *d_dp})
    EXPECT_TRUE(DeviceFree(p).ok());
}

INSTANTIATE_TEST_SUITE_P(KvRowSizes, PageCopyGpuTest,
                         ::testing::Values(1152 * 4, 656 * 4, 132 * 4, 4));

}  // namespace
}  // namespace hicache::cuda
