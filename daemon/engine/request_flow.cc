#include "daemon/engine/request_flow.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache {

namespace {

absl::Status AtItem(size_t i, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("items[", i, "]: ", s.message()));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

RequestFlow::RequestFlow(SessionManager* sessions, const HiCacheEngine* engine,
                         EventHub* hub)
    : sessions_(sessions), engine_(engine), hub_(hub) {}

bool RequestFlow::WantsBackup(BackupChoice choice, const MatchResult& hit,
                              absl::Span<const LogicalPage> pages) const {
  switch (choice) {
    case BackupChoice::kAlways:  // Unless it could never attach.
      return engine_->HostCopyCanJoin(hit.last_device_node);
    case BackupChoice::kNever:
      return false;
    case BackupChoice::kAuto:
      return engine_->BacksUpAtAdmit(hit.last_device_node, pages);
  }
  return false;
}

void RequestFlow::Undo(const std::string& id,
                       const std::vector<AdmitResult>& results) {
  for (const AdmitResult& r : results) {
    if (r.backup_id != 0) {
      if (absl::Status s = sessions_->Rollback(id, r.backup_id); !s.ok()) {
        spdlog::error("admit undo: rollback of backup {}: {}", r.backup_id, s);
      }
    }
    if (!r.pages.empty()) {
      if (absl::Status s = sessions_->Free(id, r.pages); !s.ok()) {
        spdlog::error("admit undo: free: {}", s);
      }
    }
    if (r.hit.lock_handle != 0) {
      if (absl::Status s = sessions_->UnlockHandles(id, {r.hit.lock_handle});
          !s.ok()) {
        spdlog::error("admit undo: unlock: {}", s);
      }
    }
  }
}

absl::StatusOr<std::vector<AdmitResult>> RequestFlow::Admit(
    const std::string& id, absl::Span<const AdmitItem> items) {
  const SessionLimits& limits = sessions_->limits();
  if (static_cast<int64_t>(items.size()) > limits.max_items_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("Admit.items has ", items.size(), " entries; the limit is ",
                     limits.max_items_per_request, " per call"));
  }
  // Sizes first: no request may ask for more pages than a call may hold.
  const int64_t page = engine_->layout().page_size();
  const int64_t page_limit =
      std::min(engine_->DevicePageCapacity(), limits.max_pages_per_request);
  int64_t pages_asked = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t reserve = items[i].reserve_tokens;
    const int64_t tokens = static_cast<int64_t>(items[i].tokens.size());
    if (reserve < 0 || reserve > limits.max_tokens_per_request) {
      return absl::InvalidArgumentError(absl::StrCat(
          "items[", i, "].reserve_tokens must be in [0, ",
          limits.max_tokens_per_request, "], got ", reserve));
    }
    if (tokens == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].tokens is empty"));
    }
    // One item can never fit beyond the pool; the call as a whole is bound
    // by the per-call limit (items past the pool are simply not admitted).
    const int64_t pages = CeilDiv(tokens + reserve, page);
    pages_asked += pages;
    if (pages > page_limit || pages_asked > limits.max_pages_per_request) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "items[", i, "]: the call asks for more than ", page_limit,
          " pages (the pool has ", engine_->DevicePageCapacity(),
          " usable device pages; --max_pages_per_request is ",
          limits.max_pages_per_request, ")"));
    }
  }
  const int64_t threshold =
      std::max<int64_t>(1, engine_->options().load_back_threshold_tokens);
  std::vector<AdmitResult> results(items.size());
  // The backups the items want, prepared together once every item is
  // placed: one host admission and eviction step for the batch (seed 001),
  // not one an item.
  std::vector<BackupSpec> specs;
  std::vector<size_t> backed;        // The item of each spec.
  std::vector<LogicalPage> claimed;  // The pages of the specs so far.
  auto prepare_backups = [&]() -> absl::Status {
    if (specs.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<uint64_t>> ids =
        sessions_->PrepareBackups(id, specs);
    if (!ids.ok()) return ids.status();
    absl::StatusOr<SessionInfo> info = sessions_->Info(id);
    for (size_t k = 0; k < backed.size(); ++k) {
      results[backed[k]].backup_id = (*ids)[k];
      if (hub_ != nullptr && (*ids)[k] != 0 && info.ok()) {
        hub_->Tag((*ids)[k], info->ns);
      }
    }
    return absl::OkStatus();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const AdmitItem& item = items[i];
    AdmitResult& result = results[i];
    absl::StatusOr<std::vector<SessionManager::SessionMatch>> match =
        sessions_->Match(id, {item.tokens}, /*lock=*/true, /*peek=*/false,
                         /*exact_tail=*/false);
    if (!match.ok()) {
      Undo(id, results);
      return AtItem(i, match.status());
    }
    result.hit = std::move(match->front());
    const MatchResult& hit = result.hit.match;
    // A host hit, or pages the storage tier holds past the tree's hit
    // (LoadBack promotes them to the host tier first).
    if (hit.host_hit_len + hit.storage_hit_len >= threshold) {
      result.admitted = true;
      result.load = true;
      continue;
    }
    const int64_t tokens = static_cast<int64_t>(item.tokens.size());
    const int64_t hit_pages = static_cast<int64_t>(hit.device_pages.size());
    // The input's new pages follow the compute-owner mode; the output
    // reserve (decoded later, by no CP split) takes any lanes.
    const int64_t input = CeilDiv(tokens, page) - hit_pages;
    const int64_t reserve =
        CeilDiv(tokens + item.reserve_tokens, page) - hit_pages - input;
    if (input + reserve > 0) {
      std::vector<AllocationItem> alloc{
          AllocationItem{.num_pages = input, .mode = item.mode}};
      if (reserve > 0) alloc.push_back(AllocationItem{.num_pages = reserve});
      absl::StatusOr<std::vector<std::vector<LogicalPage>>> pages =
          sessions_->Allocate(id, alloc);
      if (!pages.ok()) {
        if (pages.status().code() != absl::StatusCode::kResourceExhausted) {
          Undo(id, results);
          return AtItem(i, pages.status());
        }
        // First come, first served: this item and the rest wait.
        if (result.hit.lock_handle != 0) {
          if (absl::Status s =
                  sessions_->UnlockHandles(id, {result.hit.lock_handle});
              !s.ok()) {
            spdlog::error("admit: releasing item {}'s lock: {}", i, s);
          }
        }
        for (size_t j = i; j < items.size(); ++j) results[j] = AdmitResult{};
        if (absl::Status s = prepare_backups(); !s.ok()) {
          Undo(id, results);
          return s;
        }
        return results;
      }
      result.pages = std::move(pages->front());
      if (reserve > 0) {
        result.pages.insert(result.pages.end(), (*pages)[1].begin(),
                            (*pages)[1].end());
      }
    }
    result.admitted = true;
    // What the insert will cache: all of it, or a middle chunk's whole
    // pages only (RadixTree keeps no partial page of an unfinished insert).
    const int64_t cached = item.unfinished ? tokens / page * page : tokens;
    const int64_t new_input = cached - hit.device_len;
    const absl::Span<const LogicalPage> new_pages =
        absl::MakeConstSpan(result.pages)
            .first(std::min<size_t>(result.pages.size(),
                                    CeilDiv(std::max<int64_t>(new_input, 0),
                                            page)));
    if (new_input <= 0 || hit.tail_blocked) continue;
    // Whether this item's copy fits is judged with the batch's earlier
    // copies counted (write_ahead: a copy at Admit displaces nothing).
    const size_t claimed_before = claimed.size();
    claimed.insert(claimed.end(), new_pages.begin(), new_pages.end());
    if (!WantsBackup(item.backup, hit, claimed)) {
      claimed.resize(claimed_before);
      continue;
    }
    specs.push_back(BackupSpec{.pages = {new_pages.begin(), new_pages.end()},
                               .logical_len = new_input});
    backed.push_back(i);
  }
  if (absl::Status s = prepare_backups(); !s.ok()) {
    Undo(id, results);
    return s;
  }
  return results;
}

absl::StatusOr<std::vector<SessionInsertResult>> RequestFlow::Complete(
    const std::string& id, absl::Span<const CompleteItem> items) {
  const SessionLimits& limits = sessions_->limits();
  if (static_cast<int64_t>(items.size()) > limits.max_items_per_request) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Complete.items has ", items.size(), " entries; the limit is ",
        limits.max_items_per_request, " per call"));
  }
  // Every handle and every page to free, across items, checked first.
  std::vector<uint64_t> handles;
  std::vector<LogicalPage> frees;
  for (const CompleteItem& item : items) {
    handles.insert(handles.end(), item.lock_handles.begin(),
                   item.lock_handles.end());
    frees.insert(frees.end(), item.free_pages.begin(), item.free_pages.end());
  }
  if (absl::Status s = sessions_->CheckHandles(id, handles); !s.ok()) {
    return s;
  }
  if (absl::Status s = sessions_->CheckPages(id, frees); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("free_pages: ", s.message()));
  }
  std::vector<SessionInsertItem> inserts;
  inserts.reserve(items.size());
  absl::flat_hash_set<LogicalPage> inserted;
  for (const CompleteItem& item : items) {
    inserts.push_back(item.insert);
    inserted.insert(item.insert.pages.begin(), item.insert.pages.end());
  }
  if (absl::Status s = sessions_->CheckInsert(id, inserts); !s.ok()) return s;
  for (size_t i = 0; i < items.size(); ++i) {
    for (LogicalPage p : items[i].free_pages) {
      if (inserted.contains(p)) {
        return absl::InvalidArgumentError(
            absl::StrCat("items[", i, "].free_pages names page ", p,
                         ", which the call also inserts"));
      }
    }
  }
  std::vector<SessionInsertResult> results;
  results.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const CompleteItem& item = items[i];
    absl::StatusOr<std::vector<SessionInsertResult>> inserted =
        sessions_->Insert(id, {item.insert});
    if (!inserted.ok()) return AtItem(i, inserted.status());
    SessionInsertResult result = std::move(inserted->front());
    if (!result.insert.deferred) {
      if (absl::Status s = sessions_->UnlockHandles(id, item.lock_handles);
          !s.ok()) {
        return AtItem(i, s);
      }
      std::vector<LogicalPage> free = item.free_pages;
      if (item.free_uncached) {
        free.insert(free.end(), result.insert.uncached_pages.begin(),
                    result.insert.uncached_pages.end());
      }
      if (absl::Status s = sessions_->Free(id, free); !s.ok()) {
        return AtItem(i, s);
      }
    }
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace hicache
