// HiCacheEngine: Insert -- caching a request's KV in the tree, the checks of
// the pages it names (the caller's own, or the tree's at their matched
// positions) and the hand-over of adopted pages from the request to the tree.
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache {

absl::Status HiCacheEngine::CheckInsertPagesLocked(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    absl::Span<const LogicalPage> pages, uint64_t holder) {
  if (absl::Status s = PageLedger::CheckDistinct(pages, "pages"); !s.ok()) {
    return s;
  }
  const int64_t page = layout_.page_size();
  const int64_t needed =
      (static_cast<int64_t>(tokens.size()) + page - 1) / page;
  if (static_cast<int64_t>(pages.size()) != needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("insert of ", tokens.size(), " tokens needs ", needed,
                     " pages at page size ", page, ", got ", pages.size()));
  }
  // Pages the tree holds may only be passed back where the tree holds them
  // (the matched prefix); every other page must be the caller's own.
  // The lookup runs only if a tree page was passed at all.
  std::optional<MatchResult> held;
  for (size_t i = 0; i < pages.size(); ++i) {
    const std::optional<PageHolder> owner = ledger_.HolderOf(pages[i]);
    if (owner.has_value() && *owner == PageHolder::Request(holder)) continue;
    if (!owner.has_value() || owner->kind != PageHolder::Kind::kTree) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pages[", i, "] = ", pages[i],
          " is not held by this session (nor the tree's page for these "
          "tokens)"));
    }
    if (!held.has_value()) {
      absl::StatusOr<MatchResult> match =
          tree_->MatchPrefix(ns, tokens, {.record_hit = false});
      if (!match.ok()) return match.status();
      held = *std::move(match);
    }
    if (i >= held->device_pages.size() || held->device_pages[i] != pages[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "] = ", pages[i],
                       " is held by the radix tree for other tokens",
                       DroppedLaneHintLocked(pages[i])));  // engine_lanes.cc
    }
  }
  return absl::OkStatus();
}

absl::Status HiCacheEngine::CheckInsert(absl::string_view ns,
                                        absl::Span<const int32_t> tokens,
                                        absl::Span<const LogicalPage> pages,
                                        uint64_t holder) {
  MutexLock lock(&mu_);
  return CheckInsertPagesLocked(ns, tokens, pages, holder);
}

absl::StatusOr<InsertResult> HiCacheEngine::Insert(
    absl::string_view ns, absl::Span<const int32_t> tokens,
    absl::Span<const LogicalPage> pages, const InsertOptions& options,
    uint64_t holder) {
  MutexLock lock(&mu_);
  if (absl::Status s = CheckInsertPagesLocked(ns, tokens, pages, holder);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<InsertResult> result =
      InsertCacheableLocked(ns, tokens, pages, options);  // engine_lanes.cc
  if (!result.ok() || result->deferred) return result;
  absl::flat_hash_set<LogicalPage> not_adopted(result->duplicate_pages.begin(),
                                               result->duplicate_pages.end());
  not_adopted.insert(result->uncached_pages.begin(),
                     result->uncached_pages.end());
  std::vector<LogicalPage> adopted;
  for (LogicalPage page : pages) {
    if (!not_adopted.contains(page) &&
        ledger_.IsHeldBy(page, PageHolder::Request(holder))) {
      adopted.push_back(page);
    }
  }
  ledger_.Move(adopted, PageHolder::Tree());
  ledger_.Remove(result->released_pages);
  ledger_.Remove(result->duplicate_pages);
  FreeDeviceLocked(result->duplicate_pages);
  FreeDeviceLocked(result->released_pages);
  return result;
}

}  // namespace hicache
