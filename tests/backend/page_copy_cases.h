#pragma once

// Page-copy exactness cases shared by the simulated and the real runtime's
// tests: a batched copy between a device pool and a registered host pool,
// checked byte for byte (untouched bytes included) against a naive reference.

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/backend/cuda/cuda_runtime.h"
#include "gtest/gtest.h"

namespace hicache::cuda::testing {

struct PageCopyCase {
  int64_t row_bytes = 0;        // bytes_per_page of every region.
  bool src_page_first = false;  // Else region-adjacent (stride == row).
  bool dst_page_first = false;
  bool host_to_device = false;  // Else device to host.
  int32_t max_blocks = 0;
};

// Every row size (132, 656, 1152) x layout pair x direction.
std::vector<PageCopyCase> AllPageCopyCases();
std::string PageCopyCaseName(
    const ::testing::TestParamInfo<PageCopyCase>& info);

// A pool of `pages` pages of `regions` regions of `row` bytes, after `pad`
// leading bytes: region-adjacent (region r's pages contiguous, stride row)
// or page-first (a page's regions contiguous, stride regions * row).
struct PoolLayout {
  int64_t row = 0;
  int32_t regions = 0;
  int64_t pages = 0;
  bool page_first = false;
  uint64_t pad = 0;

  uint64_t bytes() const { return pad + regions * pages * row; }
  uint64_t offset(int32_t region) const {
    return pad + (page_first ? region * row : region * pages * row);
  }
  uint64_t stride() const { return page_first ? regions * row : row; }
};

// The regions of a copy from `src` to `dst` (same row and region count).
std::vector<CopyRegion> RegionsBetween(const PoolLayout& src,
                                       const PoolLayout& dst);
// Packs regions and page lists as BatchedPageCopy::descriptors expects.
void PackDescriptors(const std::vector<CopyRegion>& regions,
                     const std::vector<int64_t>& src_pages,
                     const std::vector<int64_t>& dst_pages, void* out);
// The naive reference: what the kernel must do to `dst`.
void ReferencePageCopy(const uint8_t* src, uint8_t* dst,
                       const std::vector<CopyRegion>& regions,
                       const std::vector<int64_t>& src_pages,
                       const std::vector<int64_t>& dst_pages);

// Runs `c` through runtime.LaunchPageCopy on a new stream of `device` and
// checks every byte of the destination pool (gtest assertions).
void CheckPageCopy(CudaRuntime& runtime, int device, const PageCopyCase& c);

}  // namespace hicache::cuda::testing
