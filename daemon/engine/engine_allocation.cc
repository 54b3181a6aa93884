// HiCacheEngine: device pages of requests -- allocation (evicting in the
// short lanes for room, within the namespace's device limit), free, and the
// page-ledger checks of who holds a page (Free, CheckHeldBy).
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/hicache_engine.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::StatusOr<std::vector<LogicalPage>> HiCacheEngine::AllocateLocked(
    absl::Span<const Rank> owners, int64_t any_lanes, PageHolder holder,
    bool may_wait, std::optional<absl::string_view> ns) {
  // More than the pool holds can never succeed: refuse before any work.
  const int64_t wanted =
      any_lanes >= 0 ? any_lanes : static_cast<int64_t>(owners.size());
  if (wanted > DevicePageCapacity()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(wanted, " device pages requested; the pool has ",
                     DevicePageCapacity(), " usable pages in all lanes"));
  }
  // The namespace's limit first: room under it comes from its own pages.
  if (ns.has_value()) {
    if (absl::Status s = FitDeviceQuotaLocked(*ns, wanted); !s.ok()) return s;
  }
  // Eviction for this allocation may take the namespace's own pages below
  // its guarantee, nobody else's.
  const EvictionScope scope{.requester = ns};
  auto attempt = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::vector<LogicalPage>> got =
        any_lanes >= 0 ? device_->Allocate(any_lanes)
                       : device_->AllocateWithOwners(owners);
    if (got.ok()) {
      ledger_.Add(*got, holder);
      write_ahead_allocated_ += static_cast<int64_t>(got->size());
    }
    return got;
  };
  absl::StatusOr<std::vector<LogicalPage>> pages = attempt();
  if (pages.ok() ||
      pages.status().code() != absl::StatusCode::kResourceExhausted) {
    if (pages.ok()) WriteAheadDueLocked();
    return pages;
  }
  // Evict in exactly the short lanes (any lanes for a plain allocation),
  // then retry once.
  DeviceEvictResult evicted;
  if (any_lanes >= 0) {
    const int64_t missing =
        any_lanes - device_->available() + l1_free_room_ * layout_.cp_size();
    std::vector<NodeId> held;
    if (options_.write_policy == WritePolicy::kWriteBack) {
      std::vector<int64_t> all(layout_.cp_size(), missing);
      const std::vector<uint64_t> staged =
          StageWriteBackLocked(all, &held, scope);
      if (may_wait) AwaitOpsLocked(staged);
    }
    evicted = ApplyDeviceEvictionLocked(
        tree_->EvictDeviceTokens(missing * layout_.page_size(), scope));
    ReleaseHostRefsLocked(held);
    WriteAheadDueLocked();
  } else {
    std::vector<int64_t> need(layout_.cp_size(), 0);
    for (Rank owner : owners) ++need[owner];
    evicted = EvictDeviceLocked(need, may_wait, scope);
  }
  pages = attempt();
  if (!pages.ok()) {
    ++stats_.device_alloc_failures;
    int64_t freed = 0;
    for (const auto& lane : evicted.freed_pages) freed += lane.size();
    spdlog::warn("device allocation failed after evicting {} pages: {}", freed,
                 pages.status().message());
    return absl::ResourceExhaustedError(
        absl::StrCat(pages.status().message(), "; eviction freed ", freed,
                     " pages (", evicted.nodes_to_host, " nodes to host, ",
                     evicted.nodes_removed, " removed)"));
  }
  return pages;
}

absl::StatusOr<std::vector<LogicalPage>> HiCacheEngine::Allocate(
    int64_t num_pages, uint64_t holder) {
  if (num_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_pages must be >= 0, got ", num_pages));
  }
  MutexLock lock(&mu_);
  // A copy: the allocation may release mu_ (write-back waits).
  const std::optional<std::string> ns(HolderNamespaceLocked(holder));
  return AllocateLocked({}, num_pages, PageHolder::Request(holder),
                        /*may_wait=*/true, ns);
}

absl::StatusOr<std::vector<LogicalPage>> HiCacheEngine::AllocateWithOwners(
    absl::Span<const Rank> owners, uint64_t holder) {
  MutexLock lock(&mu_);
  const std::optional<std::string> ns(HolderNamespaceLocked(holder));
  return AllocateLocked(owners, -1, PageHolder::Request(holder),
                        /*may_wait=*/true, ns);
}

int64_t HiCacheEngine::DevicePageCapacity() const {
  return (options_.device_pages_per_rank - 1) * layout_.cp_size();
}

int64_t HiCacheEngine::FreeAllOf(uint64_t holder) {
  MutexLock lock(&mu_);
  const std::vector<LogicalPage> pages = ledger_.PagesOfRequest(holder);
  ledger_.Remove(pages);
  FreeDeviceLocked(pages);
  return static_cast<int64_t>(pages.size());
}

int64_t HiCacheEngine::RequestPages(uint64_t holder) const {
  MutexLock lock(&mu_);
  return ledger_.CountOfRequest(holder);
}

int64_t HiCacheEngine::AllRequestPages() const {
  MutexLock lock(&mu_);
  return ledger_.Count(PageHolder::Kind::kRequest);
}

void HiCacheEngine::FreeDeviceLocked(absl::Span<const LogicalPage> pages) {
  std::vector<LogicalPage> now;
  for (LogicalPage page : pages) {
    if (!tainted_pages_.empty()) tainted_pages_.erase(page);  // Freed.
    if (busy_pages_.contains(page)) {
      free_when_idle_.insert(page);
    } else {
      now.push_back(page);
    }
  }
  absl::Status freed = device_->Free(now);
  if (!freed.ok()) {
    spdlog::error("engine freed pages it does not own: {}", freed);
  }
}

absl::Status HiCacheEngine::CheckFreeableLocked(
    absl::Span<const LogicalPage> pages, uint64_t holder) const {
  if (absl::Status s = PageLedger::CheckDistinct(pages, "pages"); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const std::optional<PageHolder> held = ledger_.HolderOf(pages[i]);
    if (held.has_value() && held->kind == PageHolder::Kind::kTree) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pages[", i, "] = ", pages[i], " is held by the radix tree"));
    }
    if (!held.has_value() || !(*held == PageHolder::Request(holder))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pages[", i, "] = ", pages[i],
          " is not held by this session (never allocated to it, or freed)"));
    }
    if (busy_pages_.contains(pages[i]) && UsedByLiveOpLocked(pages[i])) {
      return absl::FailedPreconditionError(
          absl::StrCat("pages[", i, "] = ", pages[i],
                       " is used by a backup in flight; roll it back first"));
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::Free(absl::Span<const LogicalPage> pages,
                                 uint64_t holder) {
  MutexLock lock(&mu_);
  // Validate all before freeing any; pages still copied by rolled-back ops
  // are freed when those copies finish.
  if (absl::Status s = CheckFreeableLocked(pages, holder); !s.ok()) return s;
  ledger_.Remove(pages);
  FreeDeviceLocked(pages);
  return absl::OkStatus();
}

absl::Status HiCacheEngine::CheckHeldBy(absl::Span<const LogicalPage> pages,
                                        uint64_t holder) const {
  MutexLock lock(&mu_);
  return CheckFreeableLocked(pages, holder);
}

}  // namespace hicache
