#include "daemon/backend/cuda/cuda_runtime.h"

#include "absl/strings/str_cat.h"

namespace hicache::cuda {

absl::Status ValidateRegions(const CopyRegion* regions, int32_t num_regions,
                             int64_t num_pages) {
  if (num_regions < 0 || num_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: num_regions (", num_regions,
                     ") and num_pages (", num_pages, ") must be >= 0"));
  }
  if (num_regions == 0) return absl::OkStatus();
  if (regions == nullptr) {
    if (num_pages == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("page copy: null regions with ", num_regions,
                     " regions and ", num_pages, " pages"));
  }
  for (int32_t r = 0; r < num_regions; ++r) {
    const CopyRegion& region = regions[r];
    const uint64_t size = region.bytes_per_page;
    if (size == 0 || size % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page copy region ", r,
          ": bytes_per_page must be a positive multiple of 4, got ", size));
    }
    for (const auto& [what, stride] :
         {std::pair{"src_stride", region.src_stride},
          std::pair{"dst_stride", region.dst_stride}}) {
      if (stride % 4 != 0 || stride < size) {
        return absl::InvalidArgumentError(
            absl::StrCat("page copy region ", r, ": ", what,
                         " must be a multiple of 4 and >= bytes_per_page (",
                         size, "), got ", stride));
      }
    }
    for (const auto& [what, offset] :
         {std::pair{"src_offset", region.src_offset},
          std::pair{"dst_offset", region.dst_offset}}) {
      if (offset % 4 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("page copy region ", r, ": ", what,
                         " must be a multiple of 4, got ", offset));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache::cuda
