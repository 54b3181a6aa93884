#include "tests/backend/page_copy_cases.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace hicache::cuda::testing {

std::vector<PageCopyCase> AllPageCopyCases() {
  std::vector<PageCopyCase> cases;
  for (int64_t row : {132, 656, 1152}) {
    for (bool src_page_first : {false, true}) {
      for (bool dst_page_first : {false, true}) {
        for (bool host_to_device : {true, false}) {
          cases.push_back(PageCopyCase{
              .row_bytes = row,
              .src_page_first = src_page_first,
              .dst_page_first = dst_page_first,
              .host_to_device = host_to_device,
              // A few blocks for some cases: every block loops over items.
              .max_blocks = (cases.size() % 3 == 0) ? 3 : 0});
        }
      }
    }
  }
  return cases;
}

std::string PageCopyCaseName(
    const ::testing::TestParamInfo<PageCopyCase>& info) {
  const PageCopyCase& c = info.param;
  return absl::StrCat(
      "Row", c.row_bytes, "_", c.src_page_first ? "PageFirst" : "Adjacent",
      "To", c.dst_page_first ? "PageFirst" : "Adjacent", "_",
      c.host_to_device ? "H2D" : "D2H", "_Blocks", c.max_blocks);
}

std::vector<CopyRegion> RegionsBetween(const PoolLayout& src,
                                       const PoolLayout& dst) {
  std::vector<CopyRegion> regions;
  for (int32_t r = 0; r < src.regions; ++r) {
    regions.push_back(
        CopyRegion{.src_offset = src.offset(r),
                   .dst_offset = dst.offset(r),
                   .bytes_per_page = static_cast<uint64_t>(src.row),
                   .src_stride = src.stride(),
                   .dst_stride = dst.stride()});
  }
  return regions;
}

void PackDescriptors(const std::vector<CopyRegion>& regions,
                     const std::vector<int64_t>& src_pages,
                     const std::vector<int64_t>& dst_pages, void* out) {
  char* at = static_cast<char*>(out);
  std::memcpy(at, regions.data(), regions.size() * sizeof(CopyRegion));
  at += regions.size() * sizeof(CopyRegion);
  std::memcpy(at, src_pages.data(), src_pages.size() * sizeof(int64_t));
  at += src_pages.size() * sizeof(int64_t);
  std::memcpy(at, dst_pages.data(), dst_pages.size() * sizeof(int64_t));
}

void ReferencePageCopy(const uint8_t* src, uint8_t* dst,
                       const std::vector<CopyRegion>& regions,
                       const std::vector<int64_t>& src_pages,
                       const std::vector<int64_t>& dst_pages) {
  for (const CopyRegion& region : regions) {
    for (size_t i = 0; i < src_pages.size(); ++i) {
      const uint8_t* from =
          src + region.src_offset + src_pages[i] * region.src_stride;
      uint8_t* to = dst + region.dst_offset + dst_pages[i] * region.dst_stride;
      for (uint64_t b = 0; b < region.bytes_per_page; ++b) to[b] = from[b];
    }
  }
}

void CheckPageCopy(CudaRuntime& runtime, int device, const PageCopyCase& c) {
  constexpr int32_t kRegions = 3;  // E.g. three layers.
  constexpr int64_t kPoolPages = 40;
  constexpr int64_t kCopied = 17;
  // Pads that keep or break 16-byte alignment of the regions' offsets.
  const PoolLayout src{.row = c.row_bytes,
                       .regions = kRegions,
                       .pages = kPoolPages,
                       .page_first = c.src_page_first,
                       .pad = c.src_page_first ? 4u : 16u};
  const PoolLayout dst{.row = c.row_bytes,
                       .regions = kRegions,
                       .pages = kPoolPages,
                       .page_first = c.dst_page_first,
                       .pad = c.dst_page_first ? 16u : 4u};
  std::mt19937_64 random(c.row_bytes * 8 + c.src_page_first * 4 +
                         c.dst_page_first * 2 + c.host_to_device);
  std::vector<int64_t> all(kPoolPages);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), random);
  const std::vector<int64_t> src_pages(all.begin(), all.begin() + kCopied);
  std::shuffle(all.begin(), all.end(), random);
  const std::vector<int64_t> dst_pages(all.begin(), all.begin() + kCopied);
  const std::vector<CopyRegion> regions = RegionsBetween(src, dst);

  std::vector<uint8_t> src_bytes(src.bytes()), dst_bytes(dst.bytes());
  for (uint8_t& b : src_bytes) b = static_cast<uint8_t>(random());
  for (uint8_t& b : dst_bytes) b = static_cast<uint8_t>(random());
  std::vector<uint8_t> expected = dst_bytes;
  ReferencePageCopy(src_bytes.data(), expected.data(), regions, src_pages,
                    dst_pages);

  // The host pool: page-aligned heap memory, registered.
  const PoolLayout& host_layout = c.host_to_device ? src : dst;
  const PoolLayout& device_layout = c.host_to_device ? dst : src;
  const size_t host_alloc = (host_layout.bytes() + 4095) / 4096 * 4096;
  void* host = std::aligned_alloc(4096, host_alloc);
  ASSERT_NE(host, nullptr);
  absl::StatusOr<void*> device_pool =
      runtime.DeviceMalloc(device, device_layout.bytes());
  ASSERT_TRUE(device_pool.ok()) << device_pool.status();
  ASSERT_TRUE(runtime.HostRegister(host, host_alloc).ok());
  const size_t descriptor_bytes = PackedCopyBytes(kRegions, kCopied);
  absl::StatusOr<void*> descriptors = runtime.HostAllocPinned(descriptor_bytes);
  ASSERT_TRUE(descriptors.ok()) << descriptors.status();
  PackDescriptors(regions, src_pages, dst_pages, *descriptors);

  if (c.host_to_device) {
    std::memcpy(host, src_bytes.data(), src_bytes.size());
    ASSERT_TRUE(
        runtime.CopyToDevice(*device_pool, dst_bytes.data(), dst_bytes.size())
            .ok());
  } else {
    ASSERT_TRUE(
        runtime.CopyToDevice(*device_pool, src_bytes.data(), src_bytes.size())
            .ok());
    std::memcpy(host, dst_bytes.data(), dst_bytes.size());
  }
  absl::StatusOr<Stream> stream = runtime.CreateStream(device);
  ASSERT_TRUE(stream.ok()) << stream.status();
  BatchedPageCopy copy{.src_base = c.host_to_device ? host : *device_pool,
                       .dst_base = c.host_to_device ? *device_pool : host,
                       .descriptors = *descriptors,
                       .num_regions = kRegions,
                       .num_pages = kCopied,
                       .max_blocks = c.max_blocks};
  ASSERT_TRUE(runtime.LaunchPageCopy(copy, *stream).ok());
  ASSERT_TRUE(runtime.SynchronizeStream(*stream).ok());

  std::vector<uint8_t> got(dst.bytes());
  if (c.host_to_device) {
    ASSERT_TRUE(runtime.CopyToHost(got.data(), *device_pool, got.size()).ok());
  } else {
    std::memcpy(got.data(), host, got.size());
  }
  for (size_t b = 0; b < got.size(); ++b) {
    ASSERT_EQ(got[b], expected[b]) << "byte " << b << " of the destination";
  }

  EXPECT_TRUE(runtime.DestroyStream(*stream).ok());
  EXPECT_TRUE(runtime.HostFreePinned(*descriptors).ok());
  EXPECT_TRUE(runtime.HostUnregister(host).ok());
  EXPECT_TRUE(runtime.DeviceFree(device, *device_pool).ok());
  std::free(host);
}

}  // namespace hicache::cuda::testing
