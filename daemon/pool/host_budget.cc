#include "daemon/pool/host_budget.h"

#include "absl/strings/str_cat.h"

namespace hicache {

absl::StatusOr<HostBudget> HostBudgetOf(const DaemonConfig& config) {
  absl::StatusOr<KvGeometry> geometry = KvGeometry::OfConfig(config);
  if (!geometry.ok()) return geometry.status();
  if (config.host_bytes_per_rank == 0) {
    if (config.host_pages_per_rank > DaemonConfig::kMaxPagesPerRank) {
      return absl::InvalidArgumentError(
          absl::StrCat("host_pages_per_rank must be at most ",
                       DaemonConfig::kMaxPagesPerRank, ", got ",
                       config.host_pages_per_rank));
    }
    return geometry->HostBudgetOfPages(
        static_cast<int64_t>(config.host_pages_per_rank));
  }
  HostBudget budget = geometry->SplitHostBudget(config.host_bytes_per_rank);
  if (budget.pages == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_bytes_per_rank = ", config.host_bytes_per_rank,
        " holds no host page: a page of ", config.kv_preset,
        " at P = ", config.page_size, " takes ", geometry->BytesPerPage(),
        " bytes (target ", geometry->TargetBytesPerToken() * config.page_size,
        " + draft ", geometry->DraftBytesPerToken() * config.page_size, ")"));
  }
  return budget;
}

absl::StatusOr<HostBudget> ResolveHostPages(DaemonConfig* config) {
  absl::StatusOr<HostBudget> budget = HostBudgetOf(*config);
  if (!budget.ok()) return budget.status();
  if (config->host_bytes_per_rank != 0) {
    config->host_pages_per_rank = static_cast<uint64_t>(budget->pages);
  }
  return budget;
}

std::string DescribeHostBudget(const HostBudget& budget) {
  const uint64_t page_bytes =
      budget.pages == 0
          ? 0
          : (budget.target_bytes + budget.draft_bytes) / budget.pages;
  return absl::StrCat(
      "host tier per rank: budget ", budget.budget_bytes, " bytes -> ",
      budget.pages, " pages of ", page_bytes, " bytes, ", budget.tokens,
      " tokens each for target (", budget.target_bytes, " bytes) and draft (",
      budget.draft_bytes, " bytes), ", budget.unused_bytes, " bytes unused");
}

}  // namespace hicache
