#include "daemon/radix/cp_host_meta.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace hicache {

namespace {
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

absl::StatusOr<CpHostMeta> CpHostMeta::Create(
    int64_t logical_len, uint32_t page_size, uint32_t cp_size,
    std::vector<Rank> page_owners,
    std::vector<std::vector<int64_t>> host_pages) {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size must be a power of two, got ", page_size));
  }
  if (logical_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logical_len must be positive, got ", logical_len));
  }
  if (cp_size == 0 || host_pages.size() != cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_pages needs one list per rank (cp_size ", cp_size,
                     "), got ", host_pages.size()));
  }
  const int64_t pages = CeilDiv(logical_len, page_size);
  if (static_cast<int64_t>(page_owners.size()) != pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_owners has ", page_owners.size(), " entries; logical_len ",
        logical_len, " at page size ", page_size, " needs ", pages));
  }
  std::vector<int64_t> owned(cp_size, 0);
  for (size_t i = 0; i < page_owners.size(); ++i) {
    if (page_owners[i] >= cp_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_owners[", i, "] = ", page_owners[i],
                       " is not a rank below cp_size ", cp_size));
    }
    ++owned[page_owners[i]];
  }
  for (Rank r = 0; r < cp_size; ++r) {
    if (static_cast<int64_t>(host_pages[r].size()) != owned[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " owns ", owned[r], " pages but has ",
                       host_pages[r].size(), " host pages"));
    }
    for (int64_t page : host_pages[r]) {
      if (page < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " has negative host page ", page));
      }
    }
  }
  return CpHostMeta(logical_len, page_size, std::move(page_owners),
                    std::move(host_pages));
}

absl::StatusOr<CpHostMeta> CpHostMeta::FromOwnedTokenPositions(
    int64_t logical_len, uint32_t page_size, uint32_t cp_size,
    std::vector<Rank> page_owners,
    const std::vector<std::vector<int64_t>>& owned_token_positions,
    std::vector<std::vector<int64_t>> host_pages) {
  absl::StatusOr<CpHostMeta> meta =
      Create(logical_len, page_size, cp_size, std::move(page_owners),
             std::move(host_pages));
  if (!meta.ok()) return meta;
  if (owned_token_positions.size() != cp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("owned positions need one list per rank, got ",
                     owned_token_positions.size()));
  }
  for (Rank r = 0; r < cp_size; ++r) {
    const std::vector<int64_t>& positions = owned_token_positions[r];
    for (size_t i = 0; i < positions.size(); ++i) {
      if (positions[i] < 0 || positions[i] >= logical_len ||
          (i > 0 && positions[i] <= positions[i - 1])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " owned position [", i, "] = ", positions[i],
            " is not sorted, unique and inside [0, ", logical_len, ")"));
      }
    }
    if (positions != meta->OwnedTokenPositions(r)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r,
                       " owned positions disagree with page_owners (each "
                       "rank owns the whole pages it computed)"));
    }
  }
  return meta;
}

std::vector<int64_t> CpHostMeta::OwnedPagePositions(Rank rank) const {
  std::vector<int64_t> positions;
  for (size_t i = 0; i < page_owners_.size(); ++i) {
    if (page_owners_[i] == rank) positions.push_back(i);
  }
  return positions;
}

std::vector<int64_t> CpHostMeta::OwnedTokenPositions(Rank rank) const {
  std::vector<int64_t> positions;
  for (int64_t page : OwnedPagePositions(rank)) {
    for (int64_t t = page * page_size_;
         t < (page + 1) * page_size_ && t < logical_len_; ++t) {
      positions.push_back(t);
    }
  }
  return positions;
}

absl::StatusOr<std::pair<CpHostMeta, CpHostMeta>> CpHostMeta::Split(
    int64_t k) const {
  if (k <= 0 || k >= logical_len_ || k % page_size_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot split host metadata of ", logical_len_, " tokens at ", k,
        ": the split must be a page boundary (page size ", page_size_,
        ") strictly inside the node"));
  }
  const int64_t split_page = k / page_size_;
  std::vector<Rank> head_owners(page_owners_.begin(),
                                page_owners_.begin() + split_page);
  std::vector<Rank> tail_owners(page_owners_.begin() + split_page,
                                page_owners_.end());
  std::vector<std::vector<int64_t>> head_pages(cp_size());
  std::vector<std::vector<int64_t>> tail_pages(cp_size());
  std::vector<size_t> next(cp_size(), 0);
  for (size_t i = 0; i < page_owners_.size(); ++i) {
    const Rank r = page_owners_[i];
    const int64_t host_page = host_pages_[r][next[r]++];
    (static_cast<int64_t>(i) < split_page ? head_pages : tail_pages)[r]
        .push_back(host_page);
  }
  return std::make_pair(
      CpHostMeta(k, page_size_, std::move(head_owners), std::move(head_pages)),
      CpHostMeta(logical_len_ - k, page_size_, std::move(tail_owners),
                 std::move(tail_pages)));
}

}  // namespace hicache
