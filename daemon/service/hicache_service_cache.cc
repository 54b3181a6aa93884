// HiCacheService: pages, the tree, locks and the one-round-trip request
// calls (Admit / Complete).
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/proto_convert.h"
#include "daemon/service/rpc_util.h"

namespace hicache::service {
namespace {

void ToProto(const SessionInsertResult& r, v1::InsertResult* out) {
  out->set_deferred(r.insert.deferred);
  out->set_present_tokens(r.insert.present_len);
  out->set_cached_tokens(r.insert.cached_len);
  out->set_node(r.insert.node);
  out->mutable_duplicate_pages()->Add(r.insert.duplicate_pages.begin(),
                                      r.insert.duplicate_pages.end());
  out->mutable_uncached_pages()->Add(r.insert.uncached_pages.begin(),
                                     r.insert.uncached_pages.end());
  out->set_backup_attached(r.backup_attached);
}

// Unspecified: any lanes (no mode).
absl::StatusOr<std::optional<ComputeOwnerMode>> FromProto(
    v1::ComputeOwnerMode mode, const std::string& field) {
  switch (mode) {
    case v1::COMPUTE_OWNER_MODE_UNSPECIFIED:
      return std::nullopt;
    case v1::COMPUTE_OWNER_MODE_ZIGZAG:
      return ComputeOwnerMode::kZigzag;
    case v1::COMPUTE_OWNER_MODE_ROUND_ROBIN:
      return ComputeOwnerMode::kRoundRobin;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, " ", mode, " is not a ComputeOwnerMode"));
  }
}

grpc::Status LockOrUnlock(SessionManager* sessions,
                          const v1::LockRequest& request, bool lock,
                          v1::LockResponse* response) {
  std::vector<NodeId> nodes(request.nodes().begin(), request.nodes().end());
  if (lock) {
    if (request.lock_handles_size() > 0) {
      return Invalid("lock_handles are for Unlock; Lock takes nodes");
    }
    auto handles = sessions->Lock(request.session_id(), nodes);
    if (!handles.ok()) return ToGrpcStatus(handles.status());
    response->mutable_lock_handles()->Add(handles->begin(), handles->end());
    return grpc::Status::OK;
  }
  if (!nodes.empty() && request.lock_handles_size() > 0) {
    return Invalid("Unlock takes nodes or lock_handles, not both");
  }
  if (request.lock_handles_size() > 0) {
    std::vector<uint64_t> handles(request.lock_handles().begin(),
                                  request.lock_handles().end());
    return ToGrpcStatus(
        sessions->UnlockHandles(request.session_id(), handles));
  }
  return ToGrpcStatus(sessions->Unlock(request.session_id(), nodes));
}

}  // namespace

grpc::Status HiCacheService::Allocate(grpc::ServerContext* context,
    const v1::AllocateRequest* request_in, v1::AllocateResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Allocate"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::AllocateRequest& request = *request_in;
  const SessionLimits& limits = sessions_->limits();
  if (request.items_size() > limits.max_items_per_request) {
    return Invalid(absl::StrCat("items has ", request.items_size(),
                                " entries; the limit is ",
                                limits.max_items_per_request));
  }
  std::vector<AllocationItem> items;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::AllocateItem& in = request.items(i);
    if (in.owners_size() > limits.max_pages_per_request) {
      return Invalid(absl::StrCat("items[", i, "].owners has ",
                                  in.owners_size(), " entries; the limit is ",
                                  limits.max_pages_per_request));
    }
    AllocationItem item;
    item.num_pages = in.num_pages();
    for (int j = 0; j < in.owners_size(); ++j) {
      if (in.owners(j) >= engine_->layout().cp_size()) {
        return Invalid(absl::StrCat(
            "items[", i, "].owners[", j, "] = ", in.owners(j),
            " is not a rank below cp_size ", engine_->layout().cp_size()));
      }
      item.owners.push_back(in.owners(j));
    }
    if (in.owners_size() == 0 && in.num_pages() < 0) {
      return Invalid(absl::StrCat("items[", i, "].num_pages must be >= 0, got ",
                                  in.num_pages()));
    }
    if (in.owners_size() > 0 &&
        ((in.num_pages() != 0 && in.num_pages() != in.owners_size()) ||
         in.mode() != v1::COMPUTE_OWNER_MODE_UNSPECIFIED)) {
      return Invalid(absl::StrCat(
          "items[", i, "]: give either owners, or num_pages with a mode"));
    }
    auto mode = FromProto(in.mode(), absl::StrCat("items[", i, "].mode"));
    if (!mode.ok()) return ToGrpcStatus(mode.status());
    item.mode = *mode;
    items.push_back(std::move(item));
  }
  auto pages = sessions_->Allocate(request.session_id(), items);
  if (!pages.ok()) return ToGrpcStatus(pages.status());
  for (const auto& list : *pages) {
    ToProto(list,
            static_cast<int64_t>(list.size()) * engine_->layout().page_size(),
            response->add_allocations());
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::Free(grpc::ServerContext* context,
    const v1::FreeRequest* request_in, v1::FreeResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Free"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::FreeRequest& request = *request_in;
  std::vector<LogicalPage> pages(request.pages().begin(),
                                 request.pages().end());
  return ToGrpcStatus(sessions_->Free(request.session_id(), pages));
}

grpc::Status HiCacheService::MatchPrefix(grpc::ServerContext* context,
    const v1::MatchPrefixRequest* request_in, v1::MatchPrefixResponse* response) {
  if (grpc::Status s = guard_.Check(context, "MatchPrefix"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::MatchPrefixRequest& request = *request_in;
  if (grpc::Status s = CheckTokenBudget(
          request.items(), sessions_->limits().max_tokens_per_request);
      !s.ok()) {
    return s;
  }
  std::vector<std::vector<int32_t>> requests;
  for (int i = 0; i < request.items_size(); ++i) {
    auto tokens = DecodeTokens(request.items(i).tokens(),
                               absl::StrCat("items[", i, "].tokens"));
    if (!tokens.ok()) return ToGrpcStatus(tokens.status());
    requests.push_back(*std::move(tokens));
  }
  auto results = sessions_->Match(request.session_id(), requests,
                                  request.lock(), request.peek(),
                                  request.exact_tail());
  if (!results.ok()) return ToGrpcStatus(results.status());
  for (const SessionManager::SessionMatch& result : *results) {
    const MatchResult& r = result.match;
    v1::MatchResult* out = response->add_results();
    ToProto(r.device_pages, r.device_len, out->mutable_device());
    out->set_last_device_node(r.last_device_node);
    out->set_last_host_node(r.last_host_node);
    out->set_host_hit_tokens(r.host_hit_len);
    out->set_storage_hit_tokens(r.storage_hit_len);
    out->set_lock_handle(result.lock_handle);
    out->set_tail_blocked(r.tail_blocked);
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::Insert(grpc::ServerContext* context,
    const v1::InsertRequest* request_in, v1::InsertResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Insert"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::InsertRequest& request = *request_in;
  if (grpc::Status s = CheckTokenBudget(
          request.items(), sessions_->limits().max_tokens_per_request);
      !s.ok()) {
    return s;
  }
  std::vector<SessionInsertItem> items;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::InsertItem& in = request.items(i);
    auto tokens =
        DecodeTokens(in.tokens(), absl::StrCat("items[", i, "].tokens"));
    if (!tokens.ok()) return ToGrpcStatus(tokens.status());
    SessionInsertItem item;
    item.tokens = *std::move(tokens);
    item.pages.assign(in.pages().begin(), in.pages().end());
    item.unfinished = in.unfinished();
    item.backup_id = in.backup_id();
    items.push_back(std::move(item));
  }
  auto results = sessions_->Insert(request.session_id(), items);
  if (!results.ok()) return ToGrpcStatus(results.status());
  for (const SessionInsertResult& r : *results) {
    ToProto(r, response->add_results());
  }
  return grpc::Status::OK;
}
grpc::Status HiCacheService::Lock(grpc::ServerContext* context,
                                  const v1::LockRequest* request,
                                  v1::LockResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Lock"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request->session_id());
      !s.ok()) {
    return s;
  }
  return LockOrUnlock(sessions_, *request, /*lock=*/true, response);
}

grpc::Status HiCacheService::Unlock(grpc::ServerContext* context,
                                    const v1::LockRequest* request,
                                    v1::LockResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Unlock"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request->session_id());
      !s.ok()) {
    return s;
  }
  return LockOrUnlock(sessions_, *request, /*lock=*/false, response);
}

grpc::Status HiCacheService::Admit(grpc::ServerContext* context,
    const v1::AdmitRequest* request_in, v1::AdmitResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Admit"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::AdmitRequest& request = *request_in;
  if (grpc::Status s = CheckTokenBudget(
          request.items(), sessions_->limits().max_tokens_per_request);
      !s.ok()) {
    return s;
  }
  std::vector<AdmitItem> items;
  items.reserve(request.items_size());
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::AdmitItem& in = request.items(i);
    auto tokens =
        DecodeTokens(in.tokens(), absl::StrCat("items[", i, "].tokens"));
    if (!tokens.ok()) return ToGrpcStatus(tokens.status());
    auto mode = FromProto(in.mode(), absl::StrCat("items[", i, "].mode"));
    if (!mode.ok()) return ToGrpcStatus(mode.status());
    AdmitItem item{.tokens = *std::move(tokens),
                   .reserve_tokens = in.reserve_tokens(),
                   .mode = *mode,
                   .unfinished = in.unfinished()};
    switch (in.backup()) {
      case v1::BACKUP_CHOICE_AUTO:
        item.backup = BackupChoice::kAuto;
        break;
      case v1::BACKUP_CHOICE_NEVER:
        item.backup = BackupChoice::kNever;
        break;
      case v1::BACKUP_CHOICE_ALWAYS:
        item.backup = BackupChoice::kAlways;
        break;
      default:
        return Invalid(absl::StrCat("items[", i, "].backup ", in.backup(),
                                    " is not a BackupChoice"));
    }
    items.push_back(std::move(item));
  }
  auto results = flow_.Admit(request.session_id(), items);
  if (!results.ok()) return ToGrpcStatus(results.status());
  for (const AdmitResult& r : *results) {
    v1::AdmitResult* out = response->add_results();
    out->set_admitted(r.admitted);
    if (!r.admitted) continue;
    const MatchResult& hit = r.hit.match;
    ToProto(hit.device_pages, hit.device_len, out->mutable_device());
    out->set_lock_handle(r.hit.lock_handle);
    out->set_last_device_node(hit.last_device_node);
    out->set_host_hit_tokens(hit.host_hit_len);
    out->set_storage_hit_tokens(hit.storage_hit_len);
    out->set_last_host_node(hit.last_host_node);
    out->set_load(r.load);
    out->mutable_pages()->Add(r.pages.begin(), r.pages.end());
    out->set_backup_id(r.backup_id);
    out->set_tail_blocked(hit.tail_blocked);
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::Complete(grpc::ServerContext* context,
    const v1::CompleteRequest* request_in, v1::CompleteResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Complete"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::CompleteRequest& request = *request_in;
  if (grpc::Status s = CheckTokenBudget(
          request.items(), sessions_->limits().max_tokens_per_request);
      !s.ok()) {
    return s;
  }
  std::vector<CompleteItem> items;
  items.reserve(request.items_size());
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::CompleteItem& in = request.items(i);
    auto tokens =
        DecodeTokens(in.tokens(), absl::StrCat("items[", i, "].tokens"));
    if (!tokens.ok()) return ToGrpcStatus(tokens.status());
    CompleteItem item;
    item.insert.tokens = *std::move(tokens);
    item.insert.pages.assign(in.pages().begin(), in.pages().end());
    item.insert.unfinished = in.unfinished();
    item.insert.backup_id = in.backup_id();
    item.lock_handles.assign(in.lock_handles().begin(),
                             in.lock_handles().end());
    item.free_uncached = in.free_uncached();
    item.free_pages.assign(in.free_pages().begin(), in.free_pages().end());
    items.push_back(std::move(item));
  }
  auto results = flow_.Complete(request.session_id(), items);
  if (!results.ok()) return ToGrpcStatus(results.status());
  for (const SessionInsertResult& r : *results) {
    ToProto(r, response->add_results());
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::FinishLoad(grpc::ServerContext* context,
    const v1::FinishLoadRequest* request_in, v1::FinishLoadResponse* response) {
  if (grpc::Status s = guard_.Check(context, "FinishLoad"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::FinishLoadRequest& request = *request_in;
  return ToGrpcStatus(
      sessions_->FinishLoad(request.session_id(), request.load_id()));
}

grpc::Status HiCacheService::Pin(grpc::ServerContext* context,
    const v1::PinRequest* request_in, v1::PinResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Pin"); !s.ok()) return s;
  if (grpc::Status s = CheckSessionCaller(context, request_in->session_id());
      !s.ok()) {
    return s;
  }
  const v1::PinRequest& request = *request_in;
  return ToGrpcStatus(sessions_->Pin(request.session_id(), request.node(),
                                     absl::Milliseconds(request.ttl_ms())));
}
}  // namespace hicache::service
