#include "daemon/service/cache_service.h"

#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/service/proto_convert.h"
#include "daemon/service/rpc_util.h"

namespace hicache::service {
namespace {

// cudaIpcEventHandle_t is 64 bytes.
constexpr size_t kEventHandleBytes = 64;

// Operator-only RPCs act across tenants.
grpc::Status RequireOperator(const Caller& caller, absl::string_view rpc) {
  if (caller.is_operator) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      absl::StrCat(rpc, " is an operator RPC; ", caller.name,
                   " is not an operator (see --operator_uids, "
                   "--operator_gids, --operator_cert_names)"));
}

// The overload below must not hide those of rpc_util.h / proto_convert.h.
using ::hicache::service::ToProto;

const char* TierName(NodeTier tier) {
  switch (tier) {
    case NodeTier::kDevice:
      return "device";
    case NodeTier::kHost:
      return "host";
    case NodeTier::kBoth:
      return "both";
  }
  return "unknown";
}

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

void ToProto(const NodeInfo& n, v1::NodeInfo* out) {
  out->set_id(n.id);
  out->set_parent(n.parent);
  out->set_namespace_(n.ns);
  out->set_depth(n.depth);
  out->set_start(n.start);
  out->set_length(n.len);
  out->mutable_head_tokens()->Add(n.head_tokens.begin(), n.head_tokens.end());
  out->mutable_tail_tokens()->Add(n.tail_tokens.begin(), n.tail_tokens.end());
  out->set_tier(TierName(n.tier));
  out->set_pending_backup(n.pending_backup);
  out->set_lock_ref(n.lock_ref);
  out->set_host_ref(n.host_ref);
  out->set_hits(n.hit_count);
  out->set_priority(n.priority);
  out->set_pin_remaining_ms(n.pin_remaining_ms);
  out->mutable_page_owners()->Add(n.page_owners.begin(), n.page_owners.end());
  out->set_num_children(n.num_children);
  out->mutable_device_pages()->Add(n.device_pages.begin(),
                                   n.device_pages.end());
  for (const auto& pages : n.host_pages) {
    ToProto(pages, 0, out->add_host_pages_by_rank());
  }
}

}  // namespace

CacheRpcs::CacheRpcs(HiCacheEngine* engine, SessionManager* sessions,
                     EventHub* hub, WatchBroadcaster* watch,
                     StreamLimits limits)
    : engine_(engine),
      sessions_(sessions),
      hub_(hub),
      watch_(watch),
      limits_(limits),
      flow_(sessions, engine) {}

v1::CacheEvent CacheRpcs::ToCacheEvent(const OpEvent& event) {
  v1::CacheEvent out;
  out.set_unix_ms(absl::ToUnixMillis(absl::Now()));
  switch (event.type) {
    case OpEvent::Type::kBackupStep:
      out.set_kind("backup_step");
      break;
    case OpEvent::Type::kCommitted:
      out.set_kind("backup_committed");
      break;
    case OpEvent::Type::kRolledBack:
      out.set_kind("backup_rolled_back");
      break;
    case OpEvent::Type::kLoadStep:
      out.set_kind("load_step");
      break;
    case OpEvent::Type::kLoadDone:
      out.set_kind(event.ok ? "load_done" : "load_failed");
      break;
  }
  out.set_op(event.op);
  out.set_node(event.node);
  out.set_rank(event.rank);
  out.set_step(event.step);
  return out;
}

grpc::Status CacheRpcs::ListSessions(const Caller& caller,
                                     v1::ListSessionsResponse* response) {
  if (grpc::Status s = RequireOperator(caller, "ListSessions"); !s.ok()) {
    return s;
  }
  for (const SessionInfo& info : sessions_->List()) {
    v1::SessionSummary* out = response->add_sessions();
    out->set_session_id(info.id);
    out->set_client_name(info.client_name);
    out->set_role(info.role == SessionRole::kWorker ? v1::ROLE_WORKER
                                                    : v1::ROLE_SCHEDULER);
    out->set_rank(info.rank);
    out->set_namespace_(info.ns);
    out->set_lease_ms(absl::ToInt64Milliseconds(info.lease));
  }
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Watch(const Caller& caller,
                              grpc::ServerContext* context,
                              const v1::WatchRequest& request,
                              grpc::ServerWriter<v1::CacheEvent>* writer) {
  if (grpc::Status s = RequireOperator(caller, "Watch"); !s.ok()) return s;
  auto subscription = watch_->Subscribe();
  EngineStats last = engine_->Stats();
  absl::Time next_poll = absl::Now() + absl::Milliseconds(500);
  while (!context->IsCancelled()) {
    std::optional<v1::CacheEvent> event =
        subscription->Next(absl::Milliseconds(100));
    if (event.has_value()) {
      const bool step =
          event->kind() == "backup_step" || event->kind() == "load_step";
      if (!step || request.include_layer_events()) {
        if (!writer->Write(*event)) break;
      }
    }
    if (absl::Now() >= next_poll) {
      next_poll = absl::Now() + absl::Milliseconds(500);
      const EngineStats now = engine_->Stats();
      const int64_t device =
          now.device_evicted_pages - last.device_evicted_pages;
      const int64_t host = now.host_evicted_pages - last.host_evicted_pages;
      if (device > 0 || host > 0) {
        v1::CacheEvent evicted;
        evicted.set_unix_ms(absl::ToUnixMillis(absl::Now()));
        evicted.set_kind("evicted");
        evicted.set_detail(
            absl::StrCat("device_pages=", device, " host_pages=", host));
        if (!writer->Write(evicted)) break;
      }
      last = now;
    }
  }
  watch_->Unsubscribe(subscription);
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::OpenSession(const Caller& caller,
                                    const v1::OpenSessionRequest& request,
                                    v1::OpenSessionResponse* response) {
  if (request.client_name().empty()) {
    return Invalid("client_name must not be empty");
  }
  if (request.role() != v1::ROLE_SCHEDULER &&
      request.role() != v1::ROLE_WORKER) {
    return Invalid(absl::StrCat("role must be ROLE_SCHEDULER or ROLE_WORKER, got ",
                                request.role()));
  }
  auto session = sessions_->Open(request.client_name(),
                                 request.role() == v1::ROLE_WORKER
                                     ? SessionRole::kWorker
                                     : SessionRole::kScheduler,
                                 request.rank(), request.namespace_(),
                                 absl::Milliseconds(request.lease_ms()));
  if (!session.ok()) return ToGrpcStatus(session.status());
  response->set_session_id(session->id);
  response->set_lease_ms(absl::ToInt64Milliseconds(session->lease));
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::KeepAlive(const v1::KeepAliveRequest& request,
                                  v1::KeepAliveResponse* response) {
  auto lease = sessions_->KeepAlive(request.session_id());
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  response->set_lease_ms(absl::ToInt64Milliseconds(*lease));
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::FinishLoad(const v1::FinishLoadRequest& request) {
  return ToGrpcStatus(
      sessions_->FinishLoad(request.session_id(), request.load_id()));
}

grpc::Status CacheRpcs::RegisterFence(const v1::RegisterFenceRequest& request,
                                      v1::RegisterFenceResponse* response) {
  if (request.event_handle().size() != kEventHandleBytes) {
    return Invalid(absl::StrCat("event_handle has ",
                                request.event_handle().size(),
                                " bytes; a CUDA IPC event handle has ",
                                kEventHandleBytes));
  }
  auto fence = sessions_->RegisterFence(request.session_id(), request.rank(),
                                        request.event_handle());
  if (!fence.ok()) return ToGrpcStatus(fence.status());
  response->set_fence_id(*fence);
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::ReleaseFence(const v1::ReleaseFenceRequest& request,
                                     v1::ReleaseFenceResponse* /*response*/) {
  return ToGrpcStatus(
      sessions_->ReleaseFence(request.session_id(), request.fence_id()));
}

grpc::Status CacheRpcs::CloseSession(const v1::CloseSessionRequest& request,
                                     v1::CloseSessionResponse* response) {
  auto summary = sessions_->Close(request.session_id());
  if (!summary.ok()) return ToGrpcStatus(summary.status());
  response->set_released_locks(summary->locks);
  response->set_freed_pages(summary->pages);
  response->set_rolled_back_backups(summary->backups);
  response->set_finished_loads(summary->loads);
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::GetLayout(v1::GetLayoutResponse* response) {
  const EngineOptions& o = engine_->options();
  DaemonConfig config;
  config.page_size = o.page_size;
  config.cp_size = o.cp_size;
  config.device_pages_per_rank = o.device_pages_per_rank;
  config.host_pages_per_rank = o.host_pages_per_rank;
  config.host_layout = o.host_layout;
  ToProto(config, response->mutable_geometry());
  const KvGeometry& g = engine_->geometry();
  response->set_kv_preset(g.name());
  for (const KvFamily& f : g.families()) {
    v1::KvFamily* out = response->add_families();
    out->set_name(f.name);
    out->set_bytes_per_token(f.bytes_per_token);
    out->set_num_layers(f.num_layers);
    out->set_draft(f.draft);
  }
  response->set_bytes_per_page(g.BytesPerPage());
  response->set_num_steps(g.NumSteps());
  response->set_target_steps(g.TargetSteps());
  for (Rank r : engine_->layout().served_ranks()) {
    v1::RankSegments* rank = response->add_ranks();
    rank->set_rank(r);
    for (auto [pool, out] :
         {std::pair{engine_->pools().device(r), rank->mutable_device()},
          std::pair{engine_->pools().host(r), rank->mutable_host()}}) {
      if (pool == nullptr) continue;
      const PoolExport exported = pool->Export();
      out->set_name(exported.handle);
      out->set_size_bytes(exported.size_bytes);
      const bool shm = exported.kind == PoolExport::Kind::kSharedMemory;
      out->set_kind(shm ? "shm" : "cuda_ipc");
      if (!shm) {
        out->set_name(absl::StrCat("cuda:", exported.device, ":rank", r));
        out->set_ipc_handle(exported.handle);
        out->set_device(exported.device);
        out->set_pci_bus_id(exported.pci_bus_id);
      }
    }
  }
  // Every block's byte address, so no client guesses the region order.
  const int64_t device_pages = o.device_pages_per_rank;
  const int64_t host_pages = o.host_pages_per_rank;
  for (size_t f = 0; f < g.families().size(); ++f) {
    const int family = static_cast<int>(f);
    for (uint32_t layer = 0; layer < g.families()[f].num_layers; ++layer) {
      v1::BlockAddress* device = response->add_device_blocks();
      device->set_family(family);
      device->set_layer(layer);
      device->set_offset(g.DeviceOffset(device_pages, 0, family, layer));
      device->set_page_stride(g.BlockBytes(family));
      device->set_block_bytes(g.BlockBytes(family));
      v1::BlockAddress* host = response->add_host_blocks();
      host->set_family(family);
      host->set_layer(layer);
      host->set_offset(g.HostOffset(o.host_layout, host_pages, 0, family, layer));
      host->set_page_stride(g.PageStride(o.host_layout, family));
      host->set_block_bytes(g.BlockBytes(family));
    }
  }
  // Block index of (family, layer): blocks are listed family-major.
  std::vector<uint32_t> first_block(g.families().size(), 0);
  for (size_t f = 1; f < g.families().size(); ++f) {
    first_block[f] = first_block[f - 1] + g.families()[f - 1].num_layers;
  }
  for (uint32_t step = 0; step < g.NumSteps(); ++step) {
    v1::StepBlocks* out = response->add_steps();
    out->set_step(step);
    for (const auto& [family, layer] : g.StepBlocks(step)) {
      out->add_blocks(first_block[family] + layer);
    }
  }
  response->set_backend(engine_->backend_name());
  response->set_fences(engine_->backend_has_events());
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Allocate(const v1::AllocateRequest& request,
                                 v1::AllocateResponse* response) {
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

grpc::Status CacheRpcs::Free(const v1::FreeRequest& request) {
  std::vector<LogicalPage> pages(request.pages().begin(),
                                 request.pages().end());
  return ToGrpcStatus(sessions_->Free(request.session_id(), pages));
}

namespace {

// Tokens of all items together, checked before any is decoded.
template <typename Items>
grpc::Status CheckTokenBudget(const Items& items, int64_t limit) {
  int64_t tokens = 0;
  for (const auto& item : items) {
    tokens += static_cast<int64_t>(item.tokens().size() / 4);
  }
  if (tokens > limit) {
    return Invalid(absl::StrCat("the call carries ", tokens,
                                " tokens; the limit is ", limit,
                                " (--max_tokens_per_request)"));
  }
  return grpc::Status::OK;
}

}  // namespace

grpc::Status CacheRpcs::MatchPrefix(const v1::MatchPrefixRequest& request,
                                    v1::MatchPrefixResponse* response) {
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
    out->set_lock_handle(result.lock_handle);
    out->set_tail_blocked(r.tail_blocked);
  }
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Insert(const v1::InsertRequest& request,
                               v1::InsertResponse* response) {
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

grpc::Status CacheRpcs::Admit(const v1::AdmitRequest& request,
                              v1::AdmitResponse* response) {
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
                   .mode = *mode};
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
    out->set_last_host_node(hit.last_host_node);
    out->set_load(r.load);
    out->mutable_pages()->Add(r.pages.begin(), r.pages.end());
    out->set_backup_id(r.backup_id);
    out->set_tail_blocked(hit.tail_blocked);
  }
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Complete(const v1::CompleteRequest& request,
                                 v1::CompleteResponse* response) {
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

grpc::Status CacheRpcs::Lock(const v1::LockRequest& request, bool lock,
                             v1::LockResponse* response) {
  std::vector<NodeId> nodes(request.nodes().begin(), request.nodes().end());
  if (lock) {
    if (request.lock_handles_size() > 0) {
      return Invalid("lock_handles are for Unlock; Lock takes nodes");
    }
    auto handles = sessions_->Lock(request.session_id(), nodes);
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
        sessions_->UnlockHandles(request.session_id(), handles));
  }
  return ToGrpcStatus(sessions_->Unlock(request.session_id(), nodes));
}

grpc::Status CacheRpcs::Pin(const v1::PinRequest& request) {
  return ToGrpcStatus(sessions_->Pin(request.session_id(), request.node(),
                                     absl::Milliseconds(request.ttl_ms())));
}

grpc::Status CacheRpcs::Evict(const Caller& caller,
                              const v1::EvictRequest& request,
                              v1::EvictResponse* response) {
  if (grpc::Status s = RequireOperator(caller, "Evict"); !s.ok()) return s;
  std::vector<int64_t> device(request.device_pages_per_lane().begin(),
                              request.device_pages_per_lane().end());
  std::vector<int64_t> host(request.host_pages_per_rank().begin(),
                            request.host_pages_per_rank().end());
  for (int64_t v : device) {
    if (v < 0) return Invalid("device_pages_per_lane entries must be >= 0");
  }
  for (int64_t v : host) {
    if (v < 0) return Invalid("host_pages_per_rank entries must be >= 0");
  }
  // This call's own counts: stats deltas would include concurrent evictions.
  auto freed = engine_->EvictPages(device, host);
  if (!freed.ok()) return ToGrpcStatus(freed.status());
  response->set_device_pages_freed(freed->first);
  response->set_host_pages_freed(freed->second);
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::SetFreeRoom(const Caller& caller,
                                    const v1::SetFreeRoomRequest& request) {
  if (grpc::Status s = RequireOperator(caller, "SetFreeRoom"); !s.ok()) {
    return s;
  }
  return ToGrpcStatus(engine_->SetFreeRoom(request.l1_pages_per_lane(),
                                           request.l2_pages_per_rank()));
}

grpc::Status CacheRpcs::Stats(v1::CacheStats* out) {
  const TreeStats tree = engine_->TreeStatistics();
  const EngineStats s = engine_->Stats();
  out->set_nodes(tree.nodes);
  out->set_device_tokens(tree.device_tokens);
  out->set_protected_tokens(tree.protected_tokens);
  out->set_evictable_tokens(tree.evictable_tokens);
  out->set_host_tokens(tree.host_tokens);
  out->set_pending_backups(tree.pending_backups);
  out->set_match_calls(s.match_calls);
  out->set_query_tokens(s.query_tokens);
  out->set_device_hit_tokens(s.device_hit_tokens);
  out->set_host_hit_tokens(s.host_hit_tokens);
  out->set_backups_started(s.backups_started);
  out->set_backups_committed(s.backups_committed);
  out->set_backups_rolled_back(s.backups_rolled_back);
  out->set_backups_skipped_no_host(s.backups_skipped_no_host);
  out->set_loads_started(s.loads_started);
  out->set_loads_done(s.loads_done);
  out->set_load_misses(s.load_misses);
  out->set_device_evicted_pages(s.device_evicted_pages);
  out->set_host_evicted_pages(s.host_evicted_pages);
  out->set_device_alloc_failures(s.device_alloc_failures);
  out->set_bytes_to_host(s.bytes_to_host);
  out->set_bytes_to_device(s.bytes_to_device);
  for (Rank r = 0; r < engine_->layout().cp_size(); ++r) {
    const LaneCounts counts = engine_->LaneCountsOf(r);
    v1::LaneStats* lane = out->add_lanes();
    lane->set_lane(r);
    lane->set_free(counts.free);
    lane->set_release(counts.release);
    lane->set_allocated(counts.allocated);
    lane->set_host_used(engine_->HostUsedPages(r));
    lane->set_host_free(engine_->options().host_pages_per_rank -
                        engine_->HostUsedPages(r));
  }
  const SessionManager::Totals totals = sessions_->totals();
  out->set_sessions(totals.sessions);
  out->set_session_locks(totals.locks);
  out->set_session_pages(totals.pages);
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::DumpTree(const Caller& caller,
                                 const v1::DumpTreeRequest& request,
                                 v1::DumpTreeResponse* response) {
  if (grpc::Status s = RequireOperator(caller, "DumpTree"); !s.ok()) return s;
  auto prefix = DecodeTokens(request.prefix(), "prefix");
  if (!prefix.ok()) return ToGrpcStatus(prefix.status());
  DumpFilter filter;
  filter.ns = request.namespace_();
  filter.all_namespaces = request.all_namespaces();
  filter.prefix = *std::move(prefix);
  filter.max_depth = request.max_depth() == 0 ? -1 : request.max_depth();
  filter.limit = request.limit() <= 0 ? -1 : request.limit();
  for (const NodeInfo& n : engine_->Dump(filter))
    ToProto(n, response->add_nodes());
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::InspectNode(const Caller& caller,
                                    const v1::InspectNodeRequest& request,
                                    v1::NodeInfo* response) {
  if (grpc::Status s = RequireOperator(caller, "InspectNode"); !s.ok()) {
    return s;
  }
  auto info = engine_->Inspect(request.node());
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, response);
  return grpc::Status::OK;
}

}  // namespace hicache::service
