// Ops of //fuzz:service_fuzzer (Run, service_fuzz_run.h) on the tree:
// MatchPrefix and Insert.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// Returns the first result (empty when the call failed). Lock handles
// become the session's.
std::optional<v1::MatchResult> Run::Match(const std::string& id,
                                          SessionState* s,
                                          const std::vector<Tokens>& items,
                                          bool lock, bool peek,
                                          bool exact_tail) {
  v1::MatchPrefixRequest request;
  request.set_session_id(id);
  request.set_lock(lock);
  request.set_peek(peek);
  request.set_exact_tail(exact_tail);
  for (const Tokens& t : items) request.add_items()->set_tokens(t.Packed());
  v1::MatchPrefixResponse response;
  const grpc::Status status = service_->MatchPrefix(request, &response);
  Check("MatchPrefix", status);
  if (!status.ok() || response.results_size() == 0) return std::nullopt;
  for (const v1::MatchResult& r : response.results()) {
    for (int64_t p : r.device().pages()) Remember(pages_, p);
    if (r.last_device_node() != kNoNode) {
      Remember(nodes_, r.last_device_node());
    }
    if (r.last_host_node() != kNoNode) Remember(nodes_, r.last_host_node());
    if (!lock && r.lock_handle() != 0) {
      Fail(absl::StrCat("MatchPrefix without lock answered lock handle ",
                        r.lock_handle()),
           engine_.get());
    }
    AddHandle(id, r.lock_handle());
  }
  const v1::MatchResult& first = response.results(0);
  Trace("    match: device ", first.device().valid_tokens(), " tokens (node ",
        first.last_device_node(), "), host ", first.host_hit_tokens(),
        " (node ", first.last_host_node(), "), handle ", first.lock_handle(),
        " tail_blocked=", first.tail_blocked());
  if (s != nullptr) {
    const auto& pages = first.device().pages();
    s->matched.assign(pages.begin(), pages.end());
  }
  return first;
}

void Run::MatchOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  std::vector<Tokens> items;
  const size_t n = 1 + (b & 1) + ((b >> 1) & 1);
  for (size_t i = 0; i < n; ++i) items.push_back(ReadTokens(in_));
  Match(id, s, items, (b & 4) != 0, (b & 8) != 0);
}

// MatchPrefix with exact_tail (a sub-page tail hit is not floored), lock
// and peek from the flags.
void Run::MatchExactOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  std::vector<Tokens> items;
  const size_t n = 1 + (b & 1);
  for (size_t i = 0; i < n; ++i) items.push_back(ReadTokens(in_));
  Match(id, s, items, (b & 2) != 0, (b & 4) != 0, (b & 8) == 0);
}

// Pages for an insert of `len` tokens: by default the matched (tree) pages
// and then the session's own, as a well-behaved scheduler passes them.
std::vector<LogicalPage> Run::InsertPages(SessionState* s, size_t len) {
  const uint8_t b = in_.Byte();
  int64_t n = PagesFor(len);
  if ((b & 0x30) == 0x30) n += static_cast<int64_t>(in_.Below(3)) - 1;
  std::vector<LogicalPage> pages;
  if ((b & 3) != 3) {
    if (s != nullptr && (b & 4) == 0) {
      for (LogicalPage p : s->matched) {
        if (static_cast<int64_t>(pages.size()) < n) pages.push_back(p);
      }
    }
    const size_t start =
        (s != nullptr && !s->owned.empty()) ? (b >> 6) % s->owned.size() : 0;
    for (size_t i = 0; s != nullptr && i < s->owned.size() &&
                       static_cast<int64_t>(pages.size()) < n;
         ++i) {
      const LogicalPage p = s->owned[(start + i) % s->owned.size()];
      if (std::find(pages.begin(), pages.end(), p) == pages.end()) {
        pages.push_back(p);
      }
    }
  } else {
    // Anything: other sessions' pages, tree pages at other positions,
    // repeated and bogus ids.
    for (int64_t i = 0; i < std::max<int64_t>(n, 0); ++i) {
      pages.push_back(PickPage(s));
    }
  }
  return pages;
}

// As SessionManager does: pages the tree adopted or freed leave the
// session; uncached ones stay.
void Run::Inserted(SessionState* s, const std::vector<LogicalPage>& pages,
                   const v1::InsertResult& r) {
  Trace("    inserted: node ", r.node(), " present ", r.present_tokens(),
        " cached ", r.cached_tokens(), " deferred=", r.deferred(),
        " duplicates ", r.duplicate_pages_size(), " uncached ",
        r.uncached_pages_size(), " backup_attached=", r.backup_attached());
  if (r.node() != kNoNode) Remember(nodes_, r.node());
  for (int64_t p : r.duplicate_pages()) Remember(pages_, p);
  for (int64_t p : r.uncached_pages()) Remember(pages_, p);
  if (s == nullptr || r.deferred()) return;
  absl::flat_hash_set<LogicalPage> uncached(r.uncached_pages().begin(),
                                            r.uncached_pages().end());
  std::vector<LogicalPage> gone;
  for (LogicalPage p : pages) {
    if (!uncached.contains(p)) gone.push_back(p);
  }
  ForgetOwned(s, gone);
}

// Returns the first result (nullopt when the call failed).
std::optional<v1::InsertResult> Run::Insert(
    const std::string& id, SessionState* s,
    const std::vector<InsertItem>& items) {
  v1::InsertRequest request;
  request.set_session_id(id);
  for (const InsertItem& item : items) {
    v1::InsertItem* out = request.add_items();
    out->set_tokens(item.tokens.Packed());
    out->mutable_pages()->Add(item.pages.begin(), item.pages.end());
    out->set_unfinished(item.unfinished);
    out->set_backup_id(item.backup);
  }
  v1::InsertResponse response;
  const grpc::Status status = service_->Insert(request, &response);
  Check("Insert", status);
  if (!status.ok() || response.results_size() == 0) return std::nullopt;
  for (int i = 0; i < response.results_size(); ++i) {
    if (i < static_cast<int>(items.size())) {
      Inserted(s, items[i].pages, response.results(i));
    }
  }
  return response.results(0);
}

void Run::InsertOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  std::vector<InsertItem> items(1 + in_.Below(2));
  for (InsertItem& item : items) {
    const uint8_t b = in_.Byte();
    item.tokens = ReadTokens(in_);
    item.pages = InsertPages(s, item.tokens.tokens.size());
    item.unfinished = (b & 1) != 0;
    if ((b & 6) == 6) item.backup = PickBackup(s);
  }
  Insert(id, s, items);
}

}  // namespace hicache::fuzz
