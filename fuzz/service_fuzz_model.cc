// What //fuzz:service_fuzzer knows of the sessions (Run, service_fuzz_run.h):
// operands picked from it (sessions, pages, nodes, backups, lock handles)
// and its bookkeeping.
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// A session slot, or (1 in 5) an id that is not an open session.
// `slot_out` receives the slot index (kSlots for none).
std::string Run::PickSessionId(SessionState** state, int* slot_out) {
  const uint8_t b = in_.Byte();
  *state = nullptr;
  const int slot = b % (kSlots + 1);
  if (slot_out != nullptr) *slot_out = slot;
  if (slot < kSlots && slots_[slot].has_value()) {
    *state = &*slots_[slot];
    return slots_[slot]->id;
  }
  if (!opened_.empty() && (b & 0x10) != 0) {
    return opened_[(b >> 5) % opened_.size()];  // Maybe closed.
  }
  return (b & 0x20) != 0 ? "" : "s999-0000000000000000";
}

SessionState* Run::StateOf(const std::string& id) {
  for (auto& slot : slots_) {
    if (slot.has_value() && slot->id == id) return &*slot;
  }
  return nullptr;
}

LogicalPage Run::PickPage(SessionState* s) {
  const uint8_t b = in_.Byte();
  if (b < 96 && s != nullptr && !s->owned.empty()) {
    return s->owned[b % s->owned.size()];
  }
  if (b < 200 && !pages_.empty()) return pages_[b % pages_.size()];
  return static_cast<int64_t>(b) - 228;  // -28 .. 27, and 0.
}

std::vector<LogicalPage> Run::PickPages(SessionState* s, size_t n) {
  std::vector<LogicalPage> pages;
  for (size_t i = 0; i < n; ++i) pages.push_back(PickPage(s));
  return pages;
}

NodeId Run::PickNode() {
  const uint8_t b = in_.Byte();
  if (b < 224 && !nodes_.empty()) return nodes_[b % nodes_.size()];
  return static_cast<NodeId>(b % 8);  // 0 = no node, small ids = roots.
}

// One of the session's open stream backups, any known backup, or a bogus
// id.
uint64_t Run::PickBackup(SessionState* s) {
  const uint8_t b = in_.Byte();
  if (b < 128 && s != nullptr) {
    for (const BackupRpc& rpc : streams_) {
      if (rpc.stream != nullptr && rpc.session == s->id && !rpc.open.empty()) {
        auto it = rpc.open.begin();
        std::advance(it, b % rpc.open.size());
        return *it;
      }
    }
  }
  if (b < 224 && !backups_.empty()) return backups_[b % backups_.size()];
  return b % 4;
}

// One of the last few backups (likely still pending), any known backup
// (other sessions', Admit's), or a bogus id.
uint64_t Run::PickAnyBackup() {
  const uint8_t b = in_.Byte();
  if (b < 160 && !backups_.empty()) {
    return backups_[backups_.size() - 1 -
                    b % std::min<size_t>(backups_.size(), 4)];
  }
  if (b < 224 && !backups_.empty()) return backups_[b % backups_.size()];
  return b % 4;
}

// One of the session's lock handles, anybody's, or a bogus one.
uint64_t Run::PickHandle(SessionState* s) {
  const uint8_t b = in_.Byte();
  if (b < 128 && s != nullptr && !s->handles.empty()) {
    return s->handles[b % s->handles.size()];
  }
  if (b < 224 && !handles_.empty()) return handles_[b % handles_.size()];
  return b % 3 == 0 ? 0 : (uint64_t{1} << 63 | b);
}

void Run::ForgetOwned(SessionState* s, const std::vector<LogicalPage>& pages) {
  if (s == nullptr) return;
  for (LogicalPage p : pages) Erase(s->owned, p);
}

void Run::AddHandle(const std::string& session, uint64_t handle) {
  if (handle == 0) return;
  Remember(handles_, handle);
  if (SessionState* s = StateOf(session); s != nullptr) {
    s->handles.push_back(handle);
  }
}

void Run::KeepAdmitted(SessionState* s, Admitted a) {
  if (s == nullptr) return;
  if (s->admitted.size() >= kMaxAdmitted) {
    s->admitted.erase(s->admitted.begin());
  }
  s->admitted.push_back(std::move(a));
}

// Which of the fuzzer's session slots are still open (after expiry).
void Run::SyncSlots() {
  v1::ListSessionsResponse list;
  Check("ListSessions", service_->ListSessions(Service::Operator(), &list));
  absl::flat_hash_set<std::string> open;
  for (const auto& s : list.sessions()) open.insert(s.session_id());
  for (auto& slot : slots_) {
    if (slot.has_value() && !open.contains(slot->id)) slot.reset();
  }
}

}  // namespace hicache::fuzz
