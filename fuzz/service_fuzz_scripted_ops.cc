// Whole requests as //fuzz:service_fuzzer (Run, service_fuzz_run.h) makes
// them: a v1.0 scheduler's (Request) and a v1.1 scheduler's (Flow).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

// A request as a scheduler makes it: match (maybe locking), allocate the
// rest, prepare a backup, store its layers, insert with the backup id,
// unlock. Each flag bit deviates from the script at one place.
void Run::RequestOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const Tokens tokens = ReadTokens(in_);
  const uint8_t f = in_.Byte();
  const bool lock = (f & 1) != 0;
  std::optional<v1::MatchResult> hit = Match(id, s, {tokens}, lock, false);
  std::vector<LogicalPage> pages;
  NodeId locked = kNoNode;
  uint64_t handle = 0;
  int64_t device_len = 0;
  if (hit.has_value()) {
    pages.assign(hit->device().pages().begin(), hit->device().pages().end());
    device_len = hit->device().valid_tokens();
    if (lock && device_len > 0) {
      locked = hit->last_device_node();
      handle = hit->lock_handle();
    }
  }
  const int64_t need =
      PagesFor(tokens.tokens.size()) - static_cast<int64_t>(pages.size());
  std::vector<LogicalPage> fresh;
  if (need > 0) {
    static constexpr int kRequestModes[] = {
        v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::COMPUTE_OWNER_MODE_ZIGZAG,
        v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, v1::COMPUTE_OWNER_MODE_ZIGZAG};
    fresh = AllocatePages(id, s, need, kRequestModes[(f >> 1) & 3], nullptr);
  }
  uint64_t backup = 0;
  if ((f & 8) != 0 && !fresh.empty()) {
    v1::BackupClientMessage prepare;
    v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
    spec->mutable_pages()->Add(fresh.begin(), fresh.end());
    spec->set_logical_tokens(static_cast<int64_t>(tokens.tokens.size()) -
                             device_len);
    std::vector<uint64_t> ids;
    const absl::Status status =
        Backup(slot, id, s, prepare, 0, "Request.prepare", &ids);
    if (status.ok() && ids.size() == 1 && ids[0] != 0 && slot < kSlots) {
      backup = ids[0];
    }
  }
  if (backup != 0) {
    v1::BackupClientMessage message;
    if ((f & 16) != 0) {
      message.mutable_store_all()->set_backup_id(backup);
      (void)Backup(slot, id, s, message, 0, "Request.store_all");
    } else {
      const uint32_t last = (f & 32) != 0 ? steps_ - 1 : steps_;
      for (uint32_t step = 0; step < last; ++step) {
        message.mutable_layer_stored()->clear_backup_ids();
        message.mutable_layer_stored()->add_backup_ids(backup);
        message.mutable_layer_stored()->set_step(step);
        (void)Backup(slot, id, s, message, 0, "Request.layer_stored");
      }
    }
  }
  if ((f & 64) != 0) Settle();
  if ((f & 128) == 0) {
    std::vector<LogicalPage> all = pages;
    all.insert(all.end(), fresh.begin(), fresh.end());
    Insert(id, s, {{tokens, all, false, backup}});
  } else if (!fresh.empty()) {
    if (backup != 0) {
      v1::BackupClientMessage message;
      message.mutable_rollback()->set_backup_id(backup);
      (void)Backup(slot, id, s, message, 0, "Request.rollback");
    }
    v1::FreeRequest request;
    request.set_session_id(id);
    request.mutable_pages()->Add(fresh.begin(), fresh.end());
    const grpc::Status status = service_->Free(request);
    Check("Request.Free", status);
    if (status.ok()) ForgetOwned(s, fresh);
  }
  if (locked != kNoNode) {
    v1::LockRequest request;
    request.set_session_id(id);
    request.add_nodes(locked);
    const grpc::Status status = service_->Lock(request, false);
    Check("Request.Unlock", status);
    if (status.ok() && s != nullptr) Erase(s->handles, handle);
  }
}

// A request as a v1.1 scheduler makes it (hicache-replay): Admit; on a
// host hit LoadBack with extend_tokens, read to the end, then Allocate the
// rest; the layers of its backup stored by the scheduler or by the
// namespace's workers on their own streams; Complete with its handles,
// free_uncached and the reserve as free_pages. A deferred Complete stays
// admitted (a later Complete op retries it). Flags:
//   bits 0-1 backup {auto, never, always, always}; bit 2 zigzag lanes;
//   bit 3 workers store the layers; bit 4 the last step is not stored;
//   bit 5 settle before Complete; bit 6 no Complete now (left admitted);
//   bit 7 give up instead: roll back, free the pages, unlock.
void Run::FlowOp() {
  SessionState* s;
  int slot;
  const std::string id = PickSessionId(&s, &slot);
  const Tokens tokens = ReadTokens(in_);
  const int64_t reserve = in_.Byte() % 13;
  const uint8_t f = in_.Byte();
  const int choice = kChoices[std::min(f & 3, 2)];
  const int mode = (f & 4) != 0 ? v1::COMPUTE_OWNER_MODE_ZIGZAG
                                : v1::COMPUTE_OWNER_MODE_UNSPECIFIED;
  v1::AdmitRequest admit;
  admit.set_session_id(id);
  v1::AdmitItem* item = admit.add_items();
  item->set_tokens(tokens.Packed());
  item->set_reserve_tokens(reserve);
  item->set_mode(static_cast<v1::ComputeOwnerMode>(mode));
  item->set_backup(static_cast<v1::BackupChoice>(choice));
  std::optional<v1::AdmitResponse> admitted = Admit(id, s, admit);
  if (!admitted.has_value() || admitted->results_size() != 1 ||
      !admitted->results(0).admitted()) {
    return;
  }
  // Admit() kept it; the flow goes on with it itself.
  Admitted a;
  if (s != nullptr && !s->admitted.empty()) {
    a = s->admitted.back();
    s->admitted.pop_back();
  }
  const v1::AdmitResult& r = admitted->results(0);
  const int64_t n = static_cast<int64_t>(tokens.tokens.size());
  if (r.load()) {
    v1::LoadBackRequest load;
    load.set_session_id(id);
    load.set_tokens(tokens.Packed());
    load.set_extend_tokens(std::max<int64_t>(0, n - r.device().valid_tokens() -
                                                    r.host_hit_tokens()) +
                           reserve);
    absl::Status failed;
    std::vector<LoadResult> started;
    std::unique_ptr<LoadRpc> rpc =
        StartLoadBack(load, kBacklog, &failed, &started);
    Check("Flow.LoadBack", failed);
    bool ok = started.size() == 1;
    int64_t cached = ok ? started[0].device_len : 0;
    if (ok && started[0].lock_handle != 0) {
      a.handles.push_back(started[0].lock_handle);
    }
    if (rpc != nullptr) {
      Check("Flow.LoadBack.finish", FinishLoadRpc(*rpc, /*wait=*/true));
      for (const LoadStream::Event& done : rpc->done) {
        if (done.lock_handle != 0) a.handles.push_back(done.lock_handle);
        if (done.ok) cached += started[0].loaded_len;
      }
    }
    const size_t reuse =
        ok ? std::min<size_t>(started[0].pages.size(), cached / kPageSize) : 0;
    a.tree.clear();
    if (ok) {
      a.tree.assign(started[0].pages.begin(), started[0].pages.begin() + reuse);
    }
    const int64_t need = PagesFor(n + reserve) - static_cast<int64_t>(reuse);
    if (need > 0) {
      grpc::Status status;
      a.own = AllocatePages(id, s, need, mode, &status);
      if (!status.ok()) {
        ReleaseFlow(id, s, slot, a);
        return;
      }
    }
    const int64_t new_input = n - static_cast<int64_t>(reuse) * kPageSize;
    const bool backup =
        choice == v1::BACKUP_CHOICE_ALWAYS ||
        (choice == v1::BACKUP_CHOICE_AUTO &&
         engine_->options().write_policy == WritePolicy::kWriteThrough);
    if (backup && new_input > 0 && !a.own.empty()) {
      v1::BackupClientMessage prepare;
      v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
      const size_t pages = std::min<size_t>(a.own.size(), PagesFor(new_input));
      spec->mutable_pages()->Add(a.own.begin(), a.own.begin() + pages);
      spec->set_logical_tokens(new_input);
      std::vector<uint64_t> ids;
      const absl::Status status =
          Backup(slot, id, s, prepare, 0, "Flow.prepare", &ids);
      if (status.ok() && ids.size() == 1 && slot < kSlots) a.backup = ids[0];
    }
  }
  if (a.backup != 0) StoreLayers(id, s, slot, a.backup, f);
  if ((f & 0x20) != 0) Settle();
  if ((f & 0x80) != 0) {
    ReleaseFlow(id, s, slot, a);
    return;
  }
  if ((f & 0x40) != 0) {
    KeepAdmitted(s, std::move(a));
    return;
  }
  CompleteSource source;
  std::vector<LogicalPage> all = a.tree;
  all.insert(all.end(), a.own.begin(), a.own.end());
  const size_t keep = std::min<size_t>(all.size(), PagesFor(n));
  source.insert.assign(all.begin(), all.begin() + keep);
  source.free.assign(all.begin() + keep, all.end());
  source.handles = a.handles;
  v1::CompleteRequest complete;
  complete.set_session_id(id);
  v1::CompleteItem* out = complete.add_items();
  out->set_tokens(tokens.Packed());
  out->mutable_pages()->Add(source.insert.begin(), source.insert.end());
  out->set_backup_id(a.backup);
  out->mutable_lock_handles()->Add(source.handles.begin(),
                                   source.handles.end());
  out->set_free_uncached(true);
  out->mutable_free_pages()->Add(source.free.begin(), source.free.end());
  // Kept first, so that a deferred result leaves it admitted.
  KeepAdmitted(s, std::move(a));
  source.admitted =
      s != nullptr ? static_cast<int>(s->admitted.size()) - 1 : -1;
  Complete(id, s, complete, {source});
}

// The layers of `backup`, step by step: by the scheduler on its stream, or
// (flag bit 3) by each worker session of its namespace on the worker's
// stream (each stores its rank's share); bit 4 leaves out the last step.
void Run::StoreLayers(const std::string& id, SessionState* s, int slot,
                      uint64_t backup, uint8_t f) {
  const uint32_t last = (f & 0x10) != 0 ? steps_ - 1 : steps_;
  std::vector<int> writers;
  if ((f & 0x08) != 0 && s != nullptr) {
    for (int k = 0; k < kSlots; ++k) {
      if (slots_[k].has_value() && slots_[k]->worker &&
          slots_[k]->ns == s->ns) {
        writers.push_back(k);
      }
    }
  }
  for (uint32_t step = 0; step < last; ++step) {
    v1::BackupClientMessage message;
    message.mutable_layer_stored()->add_backup_ids(backup);
    message.mutable_layer_stored()->set_step(step);
    if (writers.empty()) {
      (void)Backup(slot, id, s, message, 0, "Flow.layer_stored");
      continue;
    }
    for (int k : writers) {
      SessionState* worker = &*slots_[k];
      v1::BackupClientMessage copy = message;
      (void)Backup(k, worker->id, worker, copy, 0, "Flow.layer_stored(worker)");
    }
  }
}

// Gives a request up: its backup rolled back, its pages freed, its locks
// released.
void Run::ReleaseFlow(const std::string& id, SessionState* s, int slot,
                      const Admitted& a) {
  if (a.backup != 0) {
    v1::BackupClientMessage message;
    message.mutable_rollback()->set_backup_id(a.backup);
    (void)Backup(slot, id, s, message, 0, "Flow.rollback");
  }
  if (!a.own.empty()) {
    v1::FreeRequest request;
    request.set_session_id(id);
    request.mutable_pages()->Add(a.own.begin(), a.own.end());
    const grpc::Status status = service_->Free(request);
    Check("Flow.Free", status);
    if (status.ok()) ForgetOwned(s, a.own);
  }
  if (!a.handles.empty()) {
    v1::LockRequest request;
    request.set_session_id(id);
    request.mutable_lock_handles()->Add(a.handles.begin(), a.handles.end());
    const grpc::Status status = service_->Lock(request, false);
    Check("Flow.Unlock", status);
    if (status.ok() && s != nullptr) {
      for (uint64_t h : a.handles) Erase(s->handles, h);
    }
  }
}

}  // namespace hicache::fuzz
