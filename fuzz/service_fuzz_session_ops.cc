// Ops of //fuzz:service_fuzzer (Run, service_fuzz_run.h) on sessions, pages
// and locks: OpenSession, CloseSession, KeepAlive, the clock and the lease
// reaper, Allocate, Free, Lock, Unlock and Pin.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/engine/session_manager.h"
#include "fuzz/service_fuzz_report.h"
#include "fuzz/service_fuzz_run.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::fuzz {

void Run::OpenOp() {
  const int slot = in_.Byte() % kSlots;
  const uint8_t b = in_.Byte();
  v1::OpenSessionRequest request;
  static constexpr const char* kNamespaces[] = {"", "a", "b", ""};
  request.set_namespace_(kNamespaces[b & 3]);
  static constexpr int kRoles[] = {v1::ROLE_SCHEDULER, v1::ROLE_WORKER,
                                   v1::ROLE_SCHEDULER, v1::ROLE_UNSPECIFIED,
                                   v1::ROLE_WORKER,    v1::ROLE_SCHEDULER,
                                   v1::ROLE_WORKER,    99};
  request.set_role(static_cast<v1::Role>(kRoles[(b >> 2) & 7]));
  request.set_client_name((b & 0x20) != 0 && (b & 0x40) != 0 ? "" : "fuzz");
  request.set_rank(in_.Byte() % (cp_ + 1));
  static constexpr uint32_t kLeases[] = {0, 50, 1000, 0xffffffffu};
  request.set_lease_ms(kLeases[(b >> 6) & 3]);
  v1::OpenSessionResponse response;
  const grpc::Status status = service_->OpenSession(request, &response);
  Check("OpenSession", status);
  if (!status.ok()) return;
  opened_.push_back(response.session_id());
  session_ns_[response.session_id()] = request.namespace_();
  // The slot's previous client is done with its stream.
  EndBackup(streams_[slot], /*broken=*/false);
  slots_[slot].emplace();
  slots_[slot]->id = response.session_id();
  slots_[slot]->ns = request.namespace_();
  slots_[slot]->worker = request.role() == v1::ROLE_WORKER;
  slots_[slot]->rank = request.rank();
}

void Run::CloseOp() {
  SessionState* s;
  v1::CloseSessionRequest request;
  request.set_session_id(PickSessionId(&s));
  const grpc::Status status = service_->CloseSession(request);
  Check("CloseSession", status);
  for (auto& slot : slots_) {
    if (slot.has_value() && slot->id == request.session_id()) slot.reset();
  }
}

void Run::KeepAliveOp() {
  SessionState* s;
  v1::KeepAliveRequest request;
  request.set_session_id(PickSessionId(&s));
  Check("KeepAlive", service_->KeepAlive(request));
}

void Run::AdvanceOp() {
  static constexpr absl::Duration kSteps[] = {
      absl::Milliseconds(20), absl::Seconds(1), absl::Seconds(11),
      absl::Hours(25)};
  clock_.Advance(kSteps[in_.Byte() & 3]);
  const int expired = service_->ExpireLapsed();
  Trace("    expired ", expired);
  if (expired > 0) SyncSlots();
}

void Run::AllocateOp() {
  SessionState* s;
  v1::AllocateRequest request;
  request.set_session_id(PickSessionId(&s));
  const size_t items = 1 + in_.Below(3);
  for (size_t i = 0; i < items; ++i) {
    v1::AllocateItem* item = request.add_items();
    const uint8_t b = in_.Byte();
    if ((b & 3) == 0) {  // An exact owner pattern.
      const size_t n = in_.Below(9);
      for (size_t j = 0; j < n; ++j) {
        item->add_owners(in_.Byte() % (cp_ + ((b & 4) != 0 ? 1 : 0)));
      }
    } else {
      int64_t n = in_.Count();
      item->set_num_pages(n);
      static constexpr int kModes[] = {v1::COMPUTE_OWNER_MODE_UNSPECIFIED,
                                       v1::COMPUTE_OWNER_MODE_ZIGZAG,
                                       v1::COMPUTE_OWNER_MODE_ROUND_ROBIN, 77};
      item->set_mode(static_cast<v1::ComputeOwnerMode>(kModes[b >> 6]));
    }
  }
  v1::AllocateResponse response;
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Allocate(request, &response);
  Check("Allocate", status);
  CheckRefusalChangedNothing("Allocate", status, before);
  if (!status.ok()) return;
  for (const v1::Locations& list : response.allocations()) {
    for (int64_t p : list.pages()) {
      Remember(pages_, p);
      if (s != nullptr) s->owned.push_back(p);
    }
  }
}

// Allocates `n` pages for `id`; empty when refused.
std::vector<LogicalPage> Run::AllocatePages(const std::string& id,
                                            SessionState* s, int64_t n,
                                            int mode,
                                            grpc::Status* status_out) {
  v1::AllocateRequest request;
  request.set_session_id(id);
  v1::AllocateItem* item = request.add_items();
  item->set_num_pages(n);
  item->set_mode(static_cast<v1::ComputeOwnerMode>(mode));
  v1::AllocateResponse response;
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Allocate(request, &response);
  Check("Allocate", status);
  CheckRefusalChangedNothing("Allocate", status, before);
  if (status_out != nullptr) *status_out = status;
  std::vector<LogicalPage> fresh;
  if (status.ok() && response.allocations_size() == 1) {
    fresh.assign(response.allocations(0).pages().begin(),
                 response.allocations(0).pages().end());
    for (LogicalPage p : fresh) {
      Remember(pages_, p);
      if (s != nullptr) s->owned.push_back(p);
    }
  }
  return fresh;
}

void Run::FreeOp() {
  SessionState* s;
  v1::FreeRequest request;
  request.set_session_id(PickSessionId(&s));
  std::vector<LogicalPage> pages = PickPages(s, in_.Below(5));
  request.mutable_pages()->Add(pages.begin(), pages.end());
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Free(request);
  Check("Free", status);
  CheckRefusalChangedNothing("Free", status, before);
  if (status.ok()) ForgetOwned(s, pages);
}

void Run::LockOp() {
  SessionState* s;
  v1::LockRequest request;
  const std::string id = PickSessionId(&s);
  request.set_session_id(id);
  const uint8_t b = in_.Byte();
  const size_t n = 1 + (b & 3);
  for (size_t i = 0; i < n; ++i) request.add_nodes(PickNode());
  v1::LockResponse response;
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Lock(request, (b & 4) == 0, &response);
  Check((b & 4) != 0 ? "Unlock" : "Lock", status);
  CheckRefusalChangedNothing((b & 4) != 0 ? "Unlock" : "Lock", status, before);
  if (status.ok()) {
    for (uint64_t h : response.lock_handles()) AddHandle(id, h);
  }
}

// Unlock by lock_handles: own, foreign, repeated, bogus; sometimes with
// nodes too, or sent to Lock (both refused).
void Run::UnlockHandlesOp() {
  SessionState* s;
  const std::string id = PickSessionId(&s);
  const uint8_t b = in_.Byte();
  v1::LockRequest request;
  request.set_session_id(id);
  const size_t n = 1 + (b & 3);
  for (size_t i = 0; i < n; ++i) request.add_lock_handles(PickHandle(s));
  if ((b & 4) != 0) request.add_nodes(PickNode());
  const bool lock = (b & 8) != 0;
  const SessionManager::Totals before = sessions_->totals();
  const grpc::Status status = service_->Lock(request, lock);
  Check(lock ? "Lock(lock_handles)" : "Unlock(lock_handles)", status);
  CheckRefusalChangedNothing("Unlock(lock_handles)", status, before);
  if (lock && status.ok()) {
    Fail("Lock with lock_handles was accepted", engine_.get());
  }
  if (status.ok() && s != nullptr) {
    for (uint64_t h : request.lock_handles()) Erase(s->handles, h);
  }
}

void Run::PinOp() {
  SessionState* s;
  v1::PinRequest request;
  request.set_session_id(PickSessionId(&s));
  request.set_node(PickNode());
  static constexpr uint32_t kTtls[] = {0, 10, 1000, 0xffffffffu};
  request.set_ttl_ms(kTtls[in_.Byte() & 3]);
  Check("Pin", service_->Pin(request));
}

}  // namespace hicache::fuzz
