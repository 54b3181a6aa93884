// SessionManager: a session's device pages -- Allocate (sizes checked before
// any work; all or nothing), Free and CheckPages, on the engine's page ledger
// under the session's holder id.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "daemon/engine/session_manager.h"
#include "spdlog/spdlog.h"

namespace hicache {

absl::StatusOr<std::vector<std::vector<LogicalPage>>> SessionManager::Allocate(
    const std::string& id, absl::Span<const AllocationItem> items) {
  if (absl::Status s = CheckItems(items.size(), "Allocate.items"); !s.ok()) {
    return s;
  }
  // Sizes first, before any work: no request may cause a large allocation,
  // a long lock hold or an allocation that cannot succeed.
  const int64_t capacity = engine_->DevicePageCapacity();
  const int64_t limit = std::min(capacity, limits_.max_pages_per_request);
  int64_t total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const AllocationItem& item = items[i];
    const int64_t n = item.owners.empty()
                          ? item.num_pages
                          : static_cast<int64_t>(item.owners.size());
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].num_pages must be >= 0, got ", item.num_pages));
    }
    if (n > limit - total) {
      return absl::ResourceExhaustedError(
          absl::StrCat("items[", i, "]: the call asks for more than ", limit,
                       " pages (the pool has ", capacity,
                       " usable device pages; --max_pages_per_request is ",
                       limits_.max_pages_per_request, ")"));
    }
    total += n;
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Allocate");
  if (!session.ok()) return session.status();
  const uint64_t holder = (*session)->holder;
  std::vector<std::vector<LogicalPage>> out;
  auto undo = [&] {
    for (const auto& pages : out) {
      if (absl::Status s = engine_->Free(pages, holder); !s.ok()) {
        spdlog::error("session {}: undoing an allocation failed: {}", id, s);
      }
    }
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const AllocationItem& item = items[i];
    absl::StatusOr<std::vector<LogicalPage>> pages;
    if (!item.owners.empty()) {
      pages = engine_->AllocateWithOwners(item.owners, holder);
    } else if (item.mode.has_value()) {
      pages = engine_->AllocateWithOwners(
          engine_->layout().ComputeOwners(item.num_pages, *item.mode), holder);
    } else {
      pages = engine_->Allocate(item.num_pages, holder);
    }
    if (!pages.ok()) {
      undo();  // All or nothing.
      return absl::Status(
          pages.status().code(),
          absl::StrCat("items[", i, "]: ", pages.status().message()));
    }
    out.push_back(*std::move(pages));
  }
  return out;
}

absl::Status SessionManager::Free(const std::string& id,
                                  absl::Span<const LogicalPage> pages) {
  if (static_cast<int64_t>(pages.size()) > limits_.max_pages_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("Free names ", pages.size(), " pages; the limit is ",
                     limits_.max_pages_per_request));
  }
  MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = FindScheduler(id, "Free");
  if (!session.ok()) return session.status();
  return engine_->Free(pages, (*session)->holder);
}

absl::Status SessionManager::CheckPages(
    const std::string& id, absl::Span<const LogicalPage> pages) const {
  if (static_cast<int64_t>(pages.size()) > limits_.max_pages_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("the call names ", pages.size(), " pages; the limit is ",
                     limits_.max_pages_per_request));
  }
  MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session '", id, "'"));
  }
  return engine_->CheckHeldBy(pages, it->second.holder);
}

}  // namespace hicache
