// BackupSession ops of //fuzz:service_fuzzer (Run, service_fuzz_run.h): the
// client's messages (prepare, layer_stored, store_all, rollback) on each
// session slot's stream, and the client going away.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// BackupSession messages. Each session slot has one stream (streams_); a
// message for an id that is no open slot goes on a scratch stream.
// `b` bit 6 puts another session's id on the message (the server ends
// the stream), bit 7 leaves the id out (allowed after the first).
BackupRpc& Run::StreamFor(int slot, const std::string& id, uint8_t b,
                          v1::BackupClientMessage* message) {
  BackupRpc& rpc = streams_[std::min(slot, kSlots)];
  message->set_session_id(id);
  if (rpc.stream != nullptr && (b & 0x80) != 0) message->clear_session_id();
  if ((b & 0x40) != 0 && !opened_.empty()) {
    message->set_session_id(opened_[b % opened_.size()]);
  }
  return rpc;
}

absl::Status Run::Backup(int slot, const std::string& id, SessionState* s,
                         v1::BackupClientMessage& message, uint8_t b,
                         absl::string_view what,
                         std::vector<uint64_t>* prepared, size_t backlog) {
  BackupRpc& rpc = StreamFor(slot, id, b, &message);
  std::vector<uint64_t> ids;
  bool ended = false;
  const absl::Status status =
      BackupMessage(rpc, message, backlog, &ids, &ended);
  Check(what, status);
  for (uint64_t backup : ids) {
    Trace("    prepared backup ", backup);
    if (backup != 0) Remember(backups_, backup);
  }
  if (prepared != nullptr) *prepared = ids;
  if (ended || slot >= kSlots) {
    Trace("    stream ends");
    EndBackup(rpc, /*broken=*/true);
  }
  return status;
}

void Run::PrepareOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  v1::BackupClientMessage message;
  const uint8_t flags = in_.Byte();
  const size_t specs = 1 + (flags & 1);
  for (size_t i = 0; i < specs; ++i) {
    v1::BackupSpec* spec = message.mutable_prepare()->add_specs();
    const uint8_t b = in_.Byte();
    std::vector<LogicalPage> pages;
    if ((b & 1) == 0 && s != nullptr && !s->owned.empty()) {
      // A tail of the session's own pages, in order.
      const size_t n = 1 + in_.Below(std::min<size_t>(s->owned.size(), 8));
      pages.assign(s->owned.end() - n, s->owned.end());
    } else {
      pages = PickPages(s, in_.Below(5));
    }
    spec->mutable_pages()->Add(pages.begin(), pages.end());
    const int64_t full = static_cast<int64_t>(pages.size()) * kPageSize;
    spec->set_logical_tokens((b & 6) == 6 ? in_.Count()
                                          : full - in_.Below(kPageSize));
  }
  (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.prepare");
}

void Run::LayerStoredOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const uint8_t flags = in_.Byte();
  v1::BackupClientMessage message;
  const size_t n = 1 + (flags & 1);
  for (size_t i = 0; i < n; ++i) {
    message.mutable_layer_stored()->add_backup_ids(PickBackup(s));
  }
  message.mutable_layer_stored()->set_step(in_.Below(steps_ + 2));
  (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.layer_stored");
}

// layer_stored as a worker sends it for its rank (any session may, on its
// own stream): backups of its namespace's schedulers (Admit's too), other
// namespaces' and bogus ones, with fences of its rank, another rank, too
// many, or none. No fence exists on this backend (RegisterFence refuses).
void Run::WorkerStoreOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const uint8_t flags = in_.Byte();
  v1::BackupClientMessage message;
  v1::BackupClientMessage::LayerStored* stored = message.mutable_layer_stored();
  const size_t n = 1 + (flags & 1);
  for (size_t i = 0; i < n; ++i) stored->add_backup_ids(PickAnyBackup());
  stored->set_step(in_.Below(steps_ + 2));
  const Rank own = s != nullptr ? s->rank : 0;
  switch ((flags >> 1) & 3) {
    case 0:
      break;
    case 1: {
      v1::RankFence* fence = stored->add_fences();
      fence->set_rank(own);
      fence->set_fence_id(in_.Byte() % 4);
      break;
    }
    case 2:
      for (Rank r = 0; r <= cp_; ++r) {
        v1::RankFence* fence = stored->add_fences();
        fence->set_rank(r);
        fence->set_fence_id(r + 1);
      }
      break;
    default: {
      v1::RankFence* fence = stored->add_fences();
      fence->set_rank((own + 1) % (cp_ + 1));
      fence->set_fence_id(1);
      break;
    }
  }
  const absl::Status status =
      Backup(slot, id, s, message, flags & 0xC0, "Backup.layer_stored(worker)");
  if (status.ok() && stored->fences_size() > 0) {
    Fail(
        "layer_stored named a fence, yet no fence can exist on this "
        "backend",
        engine_.get());
  }
}

void Run::StoreAllOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const uint8_t flags = in_.Byte();
  v1::BackupClientMessage message;
  message.mutable_store_all()->set_backup_id(PickBackup(s));
  (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.store_all");
}

void Run::RollbackOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const uint8_t flags = in_.Byte();
  v1::BackupClientMessage message;
  message.mutable_rollback()->set_backup_id(PickBackup(s));
  (void)Backup(slot, id, s, message, flags & 0xC0, "Backup.rollback");
}

// A BackupSession whose first message carries only the session id (the
// server answers "empty message" and goes on) and whose mailbox holds
// {65536, 1, 2, 8} events: small bounds overflow, which cancels the RPC.
void Run::BackupOpenOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const uint8_t b = in_.Byte();
  static constexpr size_t kBacklogs[] = {kBacklog, 1, 2, 8};
  v1::BackupClientMessage message;
  (void)Backup(slot, id, s, message, b & 0xC0, "Backup.open", nullptr,
               kBacklogs[b & 3]);
}

// The client half-closes its stream (bit 0: the stream breaks instead).
void Run::StreamEndOp() {
  const uint8_t b = in_.Byte();
  EndBackup(streams_[(b >> 1) % kSlots], (b & 1) != 0);
}

}  // namespace hicache::fuzz
