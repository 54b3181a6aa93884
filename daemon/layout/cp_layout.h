#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace hicache {

// Page and location vocabulary. Logical ids are what the radix tree, the
// scheduler and every client see; physical ids index one rank's pool.
using LogicalPage = int64_t;   // Logical page L covers locations [L*P, L*P+P).
using PhysicalPage = int64_t;  // A page index inside one rank's pool.
using TokenLoc = int64_t;      // A logical token location.
using Rank = uint32_t;         // A CP rank; also the lane it owns.

// Where one logical token location lives physically.
struct PhysicalLoc {
  Rank lane;
  int64_t loc;  // physical_page * P + offset within the page.
  bool operator==(const PhysicalLoc&) const = default;
};

// How a prefill's pages are assigned to the ranks that compute (and therefore
// store) them.
enum class ComputeOwnerMode {
  // NSA in-sequence split: 2C segments, rank r computes segments r and
  // 2C-1-r; segment lengths floor(N/2C), the first N mod 2C one page longer.
  kZigzag,
  // Page i is owned by rank i mod C.
  kRoundRobin,
};

// Context-parallel shared-KV layout: pure arithmetic between the logical page
// space and each rank's physical pages. Immutable and thread-safe.
//
// Lanes: logical page L is owned by rank L mod C and lives at physical page
// L div C on that rank. Logical page L = physical * C + lane.
//
// Padding convention: physical page 0 of every lane (logical pages 0..C-1) is
// reserved. Allocators never hand it out; engines point padded or dummy token
// slots at it (the "dummy slot" serving engines keep), so a stray write never
// lands in live KV.
class CpLayout {
 public:
  static constexpr PhysicalPage kReservedPhysicalPage = 0;

  // REQUIRES nothing; returns INVALID_ARGUMENT when page_size is not a power
  // of two in [1, 65536], cp_size is 0 or above 256, or served_ranks is not
  // strictly ascending inside [0, cp_size). Empty served_ranks means all.
  static absl::StatusOr<CpLayout> Create(uint32_t page_size, uint32_t cp_size,
                                         std::vector<Rank> served_ranks = {});

  uint32_t page_size() const { return page_size_; }
  uint32_t cp_size() const { return cp_size_; }
  const std::vector<Rank>& served_ranks() const { return served_ranks_; }
  bool Serves(Rank rank) const;

  // Lane arithmetic. REQUIRES: page >= 0, lane < cp_size.
  Rank LaneOf(LogicalPage page) const {
    return static_cast<Rank>(page % cp_size_);
  }
  PhysicalPage PhysicalPageOf(LogicalPage page) const {
    return page / cp_size_;
  }
  LogicalPage LogicalPageOf(Rank lane, PhysicalPage physical) const {
    return physical * cp_size_ + lane;
  }
  bool IsReserved(LogicalPage page) const {
    return PhysicalPageOf(page) == kReservedPhysicalPage;
  }

  // Location arithmetic. REQUIRES: loc >= 0.
  LogicalPage PageOfLoc(TokenLoc loc) const { return loc >> page_shift_; }
  PhysicalLoc ToPhysical(TokenLoc loc) const;
  TokenLoc ToLogical(PhysicalLoc physical) const;

  // Validating forms for input that comes from outside the daemon.
  absl::StatusOr<PhysicalLoc> CheckedToPhysical(TokenLoc loc) const;
  absl::StatusOr<TokenLoc> CheckedToLogical(PhysicalLoc physical) const;

  // The locations of `pages`, page by page, `valid_tokens` in total: the last
  // page may be partial. REQUIRES: valid_tokens in ((n-1)*P, n*P].
  std::vector<TokenLoc> LocsOfPages(absl::Span<const LogicalPage> pages,
                                    int64_t valid_tokens) const;

  // Indices i of `locs` whose page is in `rank`'s lane, ascending.
  std::vector<int64_t> OwnedPositions(absl::Span<const TokenLoc> locs,
                                      Rank rank) const;
  // The physical locations (on `rank`) of those positions, in the same order.
  std::vector<int64_t> OwnedPhysicalLocs(absl::Span<const TokenLoc> locs,
                                         Rank rank) const;
  // The lane of every page in `pages`.
  std::vector<Rank> OwnersOf(absl::Span<const LogicalPage> pages) const;

  // Compute-owner pattern for an extend of `num_pages` pages.
  std::vector<Rank> ComputeOwners(int64_t num_pages,
                                  ComputeOwnerMode mode) const;

  // INVALID_ARGUMENT unless every owner is < cp_size (names the index).
  absl::Status ValidateOwners(absl::Span<const Rank> owners) const;

 private:
  CpLayout(uint32_t page_size, uint32_t cp_size, std::vector<Rank> ranks);

  uint32_t page_size_;
  uint32_t page_shift_;
  uint32_t cp_size_;
  std::vector<Rank> served_ranks_;
};

// The zigzag pattern on its own (also used by tests and docs).
std::vector<Rank> ZigzagComputeOwners(int64_t num_pages, uint32_t cp_size);

}  // namespace hicache
