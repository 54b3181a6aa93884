#include "daemon/engine/page_ledger.h"

#include "absl/strings/str_cat.h"
#include "daemon/core/check.h"

namespace hicache {
namespace {
int KindIndex(PageHolder::Kind kind) { return static_cast<int>(kind); }
}  // namespace

void PageLedger::Add(absl::Span<const LogicalPage> pages, PageHolder holder) {
  for (LogicalPage page : pages) {
    const bool inserted = holders_.emplace(page, holder).second;
    HICACHE_CHECK(inserted, "a page was added to the ledger twice");
    ++counts_[KindIndex(holder.kind)];
    if (holder.kind == PageHolder::Kind::kRequest) {
      requests_[holder.id].insert(page);
    }
  }
}

void PageLedger::Remove(absl::Span<const LogicalPage> pages) {
  for (LogicalPage page : pages) {
    auto it = holders_.find(page);
    HICACHE_CHECK(it != holders_.end(), "removing a page the ledger does not hold");
    const PageHolder holder = it->second;
    --counts_[KindIndex(holder.kind)];
    if (holder.kind == PageHolder::Kind::kRequest) {
      auto request = requests_.find(holder.id);
      request->second.erase(page);
      if (request->second.empty()) requests_.erase(request);
    }
    holders_.erase(it);
  }
}

void PageLedger::Move(absl::Span<const LogicalPage> pages, PageHolder to) {
  Remove(pages);
  Add(pages, to);
}

std::optional<PageHolder> PageLedger::HolderOf(LogicalPage page) const {
  auto it = holders_.find(page);
  if (it == holders_.end()) return std::nullopt;
  return it->second;
}

bool PageLedger::IsHeldBy(LogicalPage page, PageHolder holder) const {
  auto it = holders_.find(page);
  return it != holders_.end() && it->second == holder;
}

std::vector<LogicalPage> PageLedger::PagesOfRequest(uint64_t holder) const {
  auto it = requests_.find(holder);
  if (it == requests_.end()) return {};
  return std::vector<LogicalPage>(it->second.begin(), it->second.end());
}

int64_t PageLedger::CountOfRequest(uint64_t holder) const {
  auto it = requests_.find(holder);
  return it == requests_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

int64_t PageLedger::Count(PageHolder::Kind kind) const {
  return counts_[KindIndex(kind)];
}

absl::Status PageLedger::CheckDistinct(absl::Span<const LogicalPage> pages,
                                       absl::string_view field) {
  if (pages.size() < 2) return absl::OkStatus();
  absl::flat_hash_map<LogicalPage, size_t> seen;
  seen.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    auto [it, inserted] = seen.emplace(pages[i], i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "] = ", pages[i], " repeats ", field,
                       "[", it->second, "]; page ids must be distinct"));
    }
  }
  return absl::OkStatus();
}

absl::Status PageLedger::CheckInvariants() const {
  int64_t counts[3] = {0, 0, 0};
  int64_t request_pages = 0;
  for (const auto& [page, holder] : holders_) ++counts[KindIndex(holder.kind)];
  for (const auto& [id, pages] : requests_) {
    if (pages.empty()) {
      return absl::InternalError(
          absl::StrCat("ledger: empty page set kept for holder ", id));
    }
    for (LogicalPage page : pages) {
      if (!IsHeldBy(page, PageHolder::Request(id))) {
        return absl::InternalError(absl::StrCat(
            "ledger: page ", page, " indexed under request ", id,
            " but held otherwise"));
      }
    }
    request_pages += static_cast<int64_t>(pages.size());
  }
  for (int k = 0; k < 3; ++k) {
    if (counts[k] != counts_[k]) {
      return absl::InternalError(absl::StrCat("ledger: kind ", k, " counts ",
                                              counts_[k], " but holds ",
                                              counts[k]));
    }
  }
  if (request_pages != counts[KindIndex(PageHolder::Kind::kRequest)]) {
    return absl::InternalError("ledger: request index out of step");
  }
  return absl::OkStatus();
}

}  // namespace hicache
