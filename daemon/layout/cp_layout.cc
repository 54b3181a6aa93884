#include "daemon/layout/cp_layout.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hicache {

namespace {
constexpr uint32_t kMaxPageSize = 1u << 16;
constexpr uint32_t kMaxCpSize = 256;
}  // namespace

absl::StatusOr<CpLayout> CpLayout::Create(uint32_t page_size, uint32_t cp_size,
                                          std::vector<Rank> served_ranks) {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0 ||
      page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be a power of two in [1, ", kMaxPageSize,
                     "], got ", page_size));
  }
  if (cp_size == 0 || cp_size > kMaxCpSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cp_size must be in [1, ", kMaxCpSize, "], got ", cp_size));
  }
  for (size_t i = 0; i < served_ranks.size(); ++i) {
    if (served_ranks[i] >= cp_size ||
        (i > 0 && served_ranks[i] <= served_ranks[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("served_ranks must be strictly ascending ranks below "
                       "cp_size ",
                       cp_size, ", got [", absl::StrJoin(served_ranks, ","),
                       "]"));
    }
  }
  if (served_ranks.empty()) {
    for (Rank r = 0; r < cp_size; ++r) served_ranks.push_back(r);
  }
  return CpLayout(page_size, cp_size, std::move(served_ranks));
}

CpLayout::CpLayout(uint32_t page_size, uint32_t cp_size,
                   std::vector<Rank> ranks)
    : page_size_(page_size),
      page_shift_(static_cast<uint32_t>(__builtin_ctz(page_size))),
      cp_size_(cp_size),
      served_ranks_(std::move(ranks)) {}

bool CpLayout::Serves(Rank rank) const {
  for (Rank r : served_ranks_) {
    if (r == rank) return true;
  }
  return false;
}

PhysicalLoc CpLayout::ToPhysical(TokenLoc loc) const {
  const LogicalPage page = PageOfLoc(loc);
  const int64_t offset = loc & (page_size_ - 1);
  return PhysicalLoc{LaneOf(page),
                     (PhysicalPageOf(page) << page_shift_) + offset};
}

TokenLoc CpLayout::ToLogical(PhysicalLoc physical) const {
  const PhysicalPage page = physical.loc >> page_shift_;
  const int64_t offset = physical.loc & (page_size_ - 1);
  return (LogicalPageOf(physical.lane, page) << page_shift_) + offset;
}

absl::StatusOr<PhysicalLoc> CpLayout::CheckedToPhysical(TokenLoc loc) const {
  if (loc < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token location must be >= 0, got ", loc));
  }
  return ToPhysical(loc);
}

absl::StatusOr<TokenLoc> CpLayout::CheckedToLogical(
    PhysicalLoc physical) const {
  if (physical.lane >= cp_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lane ", physical.lane, " is not below cp_size ", cp_size_));
  }
  if (physical.loc < 0 ||
      physical.loc > (INT64_MAX >> page_shift_) / cp_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("physical location ", physical.loc, " is out of range"));
  }
  return ToLogical(physical);
}

std::vector<TokenLoc> CpLayout::LocsOfPages(absl::Span<const LogicalPage> pages,
                                            int64_t valid_tokens) const {
  std::vector<TokenLoc> locs;
  locs.reserve(valid_tokens);
  for (LogicalPage page : pages) {
    const TokenLoc base = page << page_shift_;
    for (uint32_t i = 0;
         i < page_size_ && static_cast<int64_t>(locs.size()) < valid_tokens;
         ++i) {
      locs.push_back(base + i);
    }
  }
  return locs;
}

std::vector<int64_t> CpLayout::OwnedPositions(absl::Span<const TokenLoc> locs,
                                              Rank rank) const {
  std::vector<int64_t> positions;
  for (size_t i = 0; i < locs.size(); ++i) {
    if (LaneOf(PageOfLoc(locs[i])) == rank) positions.push_back(i);
  }
  return positions;
}

std::vector<int64_t> CpLayout::OwnedPhysicalLocs(
    absl::Span<const TokenLoc> locs, Rank rank) const {
  std::vector<int64_t> physical;
  for (TokenLoc loc : locs) {
    const PhysicalLoc p = ToPhysical(loc);
    if (p.lane == rank) physical.push_back(p.loc);
  }
  return physical;
}

std::vector<Rank> CpLayout::OwnersOf(
    absl::Span<const LogicalPage> pages) const {
  std::vector<Rank> owners;
  owners.reserve(pages.size());
  for (LogicalPage page : pages) owners.push_back(LaneOf(page));
  return owners;
}

std::vector<Rank> ZigzagComputeOwners(int64_t num_pages, uint32_t cp_size) {
  std::vector<Rank> owners;
  if (num_pages <= 0 || cp_size == 0) return owners;
  owners.reserve(num_pages);
  const int64_t segments = 2 * static_cast<int64_t>(cp_size);
  const int64_t base = num_pages / segments;
  const int64_t longer = num_pages % segments;
  for (int64_t segment = 0; segment < segments; ++segment) {
    const int64_t length = base + (segment < longer ? 1 : 0);
    // Segment s is computed by rank s for the first half, 2C-1-s after.
    const Rank owner = static_cast<Rank>(
        segment < cp_size ? segment : segments - 1 - segment);
    owners.insert(owners.end(), length, owner);
  }
  return owners;
}

std::vector<Rank> CpLayout::ComputeOwners(int64_t num_pages,
                                          ComputeOwnerMode mode) const {
  if (mode == ComputeOwnerMode::kZigzag) {
    return ZigzagComputeOwners(num_pages, cp_size_);
  }
  std::vector<Rank> owners;
  if (num_pages <= 0) return owners;
  owners.reserve(num_pages);
  for (int64_t i = 0; i < num_pages; ++i) owners.push_back(i % cp_size_);
  return owners;
}

absl::Status CpLayout::ValidateOwners(absl::Span<const Rank> owners) const {
  for (size_t i = 0; i < owners.size(); ++i) {
    if (owners[i] >= cp_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("owners[", i, "] = ", owners[i],
                       " is not a rank below cp_size ", cp_size_));
    }
  }
  return absl::OkStatus();
}

}  // namespace hicache
