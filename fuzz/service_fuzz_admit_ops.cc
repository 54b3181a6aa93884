// Admit and Complete ops of //fuzz:service_fuzzer (Run, service_fuzz_run.h)
// and the checks of their answers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/session_manager.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// Admit and what its answer must look like: one result per item; first
// come, first served (after an item that is not admitted none is, and it
// holds nothing); an admitted item either loads (its host hit reaches the
// threshold; nothing allocated, no backup) or holds exactly
// ceil((tokens + reserve) / P) pages with its device hit; no backup when
// the item said never. The admitted items are kept for Complete.
std::optional<v1::AdmitResponse> Run::Admit(const std::string& id,
                                            SessionState* s,
                                            const v1::AdmitRequest& request) {
  v1::AdmitResponse response;
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Admit(request, &response);
  Check("Admit", status);
  CheckRefusalChangedNothing("Admit", status, before);
  if (!status.ok()) return std::nullopt;
  auto fail = [&](const std::string& what) {
    Fail(absl::StrCat("Admit: ", what), engine_.get());
  };
  if (response.results_size() != request.items_size()) {
    fail(absl::StrCat(response.results_size(), " results for ",
                      request.items_size(), " items"));
  }
  const int64_t threshold =
      std::max<int64_t>(1, engine_->options().load_back_threshold_tokens);
  auto item_tokens = [&](int i) {
    return request.items(i).tokens().size() / 4;
  };
  bool refused = false;
  int admitted = 0;
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::AdmitResult& r = response.results(i);
    const v1::AdmitItem& item = request.items(i);
    if (!r.admitted()) {
      refused = true;
      if (r.lock_handle() != 0 || r.pages_size() != 0 || r.backup_id() != 0 ||
          r.device().pages_size() != 0) {
        fail(absl::StrCat("item ", i, " is not admitted but holds something"));
      }
      continue;
    }
    ++admitted;
    Trace("    item ", i, ": ", item_tokens(i), " tokens + ",
          request.items(i).reserve_tokens(), " reserve: hit ",
          r.device().valid_tokens(), " host hit ", r.host_hit_tokens(),
          " load=", r.load(), " new pages [", absl::StrJoin(r.pages(), ","),
          "] backup ", r.backup_id(), " handle ", r.lock_handle(),
          " tail_blocked=", r.tail_blocked());
    if (refused) {
      fail(absl::StrCat("item ", i,
                        " is admitted after an earlier one "
                        "was not (first come, first served)"));
    }
    for (int64_t p : r.device().pages()) Remember(pages_, p);
    for (int64_t p : r.pages()) Remember(pages_, p);
    if (r.last_device_node() != kNoNode) Remember(nodes_, r.last_device_node());
    if (r.last_host_node() != kNoNode) Remember(nodes_, r.last_host_node());
    AddHandle(id, r.lock_handle());
    if (r.backup_id() != 0) {
      Remember(backups_, r.backup_id());
      if (auto ns = session_ns_.find(id); ns != session_ns_.end()) {
        op_ns_[r.backup_id()] = ns->second;
      }
    }
    if (s != nullptr) {
      for (int64_t p : r.pages()) s->owned.push_back(p);
    }
    const int64_t tokens = static_cast<int64_t>(item.tokens().size() / 4);
    if (r.load() != (r.host_hit_tokens() >= threshold)) {
      fail(absl::StrCat("item ", i, ": load=", r.load(), " with a host hit of ",
                        r.host_hit_tokens(), " tokens (threshold ", threshold,
                        ")"));
    }
    if (r.load()) {
      if (r.pages_size() != 0 || r.backup_id() != 0) {
        fail(absl::StrCat("item ", i, " loads, yet got pages or a backup"));
      }
    } else {
      const int64_t want =
          PagesFor(static_cast<size_t>(tokens + item.reserve_tokens()));
      const int64_t got = r.device().pages_size() + r.pages_size();
      if (got != want) {
        fail(absl::StrCat("item ", i, " of ", tokens, " tokens + ",
                          item.reserve_tokens(), " reserve holds ", got,
                          " pages (", r.device().pages_size(), " hit), not ",
                          want));
      }
    }
    if (item.backup() == v1::BACKUP_CHOICE_NEVER && r.backup_id() != 0) {
      fail(absl::StrCat("item ", i, " said never back up, got backup ",
                        r.backup_id()));
    }
    Admitted a;
    const std::string& bytes = item.tokens();
    a.tokens.resize(bytes.size() / 4);
    if (!bytes.empty())
      std::memcpy(a.tokens.data(), bytes.data(), bytes.size());
    a.tree.assign(r.device().pages().begin(), r.device().pages().end());
    a.own.assign(r.pages().begin(), r.pages().end());
    if (r.lock_handle() != 0) a.handles.push_back(r.lock_handle());
    a.backup = r.backup_id();
    a.reserve = item.reserve_tokens();
    KeepAdmitted(s, std::move(a));
  }
  Trace("    admitted ", admitted, " of ", response.results_size());
  return response;
}

// Admit: 1-4 items, or (bit 7) 8-40 items that share a prefix (the pool
// runs out: first come, first served), reserve_tokens small or at the
// edges, every mode and backup choice (also unknown ones).
void Run::AdmitOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  v1::AdmitRequest request;
  request.set_session_id(id);
  if ((b & 0x80) != 0) {
    const size_t n = 8 + in_.Below(33);
    const Tokens base = ReadTokens(in_);
    const int64_t reserve = TokenCount(in_);
    const uint8_t m = in_.Byte();
    for (size_t i = 0; i < n; ++i) {
      Tokens t = base;
      if (!t.tokens.empty()) t.tokens.back() = 200 + static_cast<int32_t>(i);
      v1::AdmitItem* item = request.add_items();
      item->set_tokens(t.Packed());
      item->set_reserve_tokens(reserve);
      item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[m & 3]));
      item->set_backup(static_cast<v1::BackupChoice>(kChoices[(m >> 2) & 3]));
    }
  } else {
    const size_t n = 1 + (b & 3);
    for (size_t i = 0; i < n; ++i) {
      v1::AdmitItem* item = request.add_items();
      item->set_tokens(ReadTokens(in_).Packed());
      item->set_reserve_tokens(TokenCount(in_));
      const uint8_t m = in_.Byte();
      item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[m & 3]));
      item->set_backup(static_cast<v1::BackupChoice>(kChoices[(m >> 2) & 3]));
    }
  }
  Admit(id, s, request);
}

// Complete: items from the session's admitted requests -- the insert of
// the input (and some output) with the hit and new pages, the request's
// handles, free_uncached and the unused reserve as free_pages -- each
// deviating at one place: a foreign or repeated handle, a free page the
// item also inserts, unfinished, no or another backup; or items made up
// from anything. A deferred item stays admitted for a retry.
void Run::CompleteOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  v1::CompleteRequest request;
  request.set_session_id(id);
  std::vector<CompleteSource> sources;
  const size_t n = 1 + (b & 1);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t d = in_.Byte();
    const uint8_t src = in_.Byte();
    CompleteSource source;
    v1::CompleteItem* item = request.add_items();
    if (s != nullptr && !s->admitted.empty() && src < 224) {
      source.admitted = static_cast<int>(src % s->admitted.size());
      const Admitted& a = s->admitted[source.admitted];
      std::vector<int32_t> tokens = a.tokens;
      if ((d & 0x80) != 0 && a.reserve > 0) {
        const size_t out = in_.Below(
            static_cast<size_t>(std::min<int64_t>(a.reserve, 16)) + 1);
        for (size_t j = 0; j < out; ++j) {
          tokens.push_back(90 + static_cast<int32_t>(j % 3));
        }
      }
      std::vector<LogicalPage> all = a.tree;
      all.insert(all.end(), a.own.begin(), a.own.end());
      const size_t keep = std::min<size_t>(all.size(), PagesFor(tokens.size()));
      source.insert.assign(all.begin(), all.begin() + keep);
      source.free.assign(all.begin() + keep, all.end());
      source.handles = a.handles;
      item->set_tokens(Pack(tokens));
      item->set_backup_id(a.backup);
    } else {
      const Tokens tokens = ReadTokens(in_);
      item->set_tokens(tokens.Packed());
      source.insert = InsertPages(s, tokens.tokens.size());
      source.handles.push_back(PickHandle(s));
      source.free = PickPages(s, in_.Below(3));
      if ((d & 0x40) != 0) item->set_backup_id(PickBackup(s));
    }
    source.free_uncached = (d & 1) == 0;
    switch ((d >> 1) & 7) {
      case 3:
        source.handles.push_back(PickHandle(nullptr));
        break;
      case 4:
        source.handles.push_back(source.handles.empty() ? PickHandle(s)
                                                        : source.handles[0]);
        break;
      case 5:
        if (!source.insert.empty()) {
          source.free.push_back(source.insert[in_.Below(source.insert.size())]);
        }
        break;
      case 6:
        item->set_unfinished(true);
        break;
      case 7:
        item->set_backup_id((d & 0x40) != 0 ? 0 : PickBackup(s));
        break;
      default:
        break;
    }
    item->mutable_pages()->Add(source.insert.begin(), source.insert.end());
    item->mutable_lock_handles()->Add(source.handles.begin(),
                                      source.handles.end());
    item->set_free_uncached(source.free_uncached);
    item->mutable_free_pages()->Add(source.free.begin(), source.free.end());
    sources.push_back(std::move(source));
  }
  Complete(id, s, request, sources);
}

// Sends Complete and keeps the fuzzer's view of the session in step.
// Returns the results (nullopt when refused).
std::optional<v1::CompleteResponse> Run::Complete(
    const std::string& id, SessionState* s, const v1::CompleteRequest& request,
    const std::vector<CompleteSource>& sources) {
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::CompleteItem& item = request.items(i);
    Trace("    item ", i, ": ", item.tokens().size() / 4, " tokens, pages [",
          absl::StrJoin(item.pages(), ","), "], backup ", item.backup_id(),
          ", handles [", absl::StrJoin(item.lock_handles(), ","),
          "], free_pages [", absl::StrJoin(item.free_pages(), ","),
          "], free_uncached=", item.free_uncached(),
          " unfinished=", item.unfinished());
  }
  v1::CompleteResponse response;
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Complete(request, &response);
  Check("Complete", status);
  CheckRefusalChangedNothing("Complete", status, before);
  std::set<int> done;  // Admitted requests that are over.
  if (!status.ok()) {
    for (const CompleteSource& source : sources) {
      if (s == nullptr || source.admitted < 0) continue;
      if (++s->admitted[source.admitted].tries > 3)
        done.insert(source.admitted);
    }
  } else {
    if (response.results_size() != request.items_size()) {
      Fail(absl::StrCat("Complete: ", response.results_size(), " results for ",
                        request.items_size(), " items"),
           engine_.get());
    }
    for (int i = 0; i < response.results_size(); ++i) {
      const v1::InsertResult& r = response.results(i);
      const CompleteSource& source = sources[i];
      Trace("    item ", i, ": deferred=", r.deferred(), " node ", r.node(),
            " backup_attached=", r.backup_attached(), " uncached ",
            r.uncached_pages_size());
      Inserted(s, source.insert, r);
      if (r.deferred()) {
        if (s != nullptr && source.admitted >= 0) {
          ++s->admitted[source.admitted].tries;  // Retried later.
        }
        continue;
      }
      if (source.free_uncached) {
        ForgetOwned(s, std::vector<LogicalPage>(r.uncached_pages().begin(),
                                                r.uncached_pages().end()));
      }
      ForgetOwned(s, source.free);
      if (s != nullptr) {
        for (uint64_t h : source.handles) Erase(s->handles, h);
      }
      if (source.admitted >= 0) done.insert(source.admitted);
    }
  }
  if (s != nullptr) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      s->admitted.erase(s->admitted.begin() + *it);
    }
  }
  if (!status.ok()) return std::nullopt;
  return response;
}

}  // namespace hicache::fuzz
