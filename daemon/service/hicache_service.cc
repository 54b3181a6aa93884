#include "daemon/service/hicache_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/service/proto_convert.h"
#include "daemon/service/rpc_util.h"
#include "spdlog/spdlog.h"

namespace hicache::service {
namespace {

// cudaIpcEventHandle_t is 64 bytes.
constexpr size_t kEventHandleBytes = 64;

}  // namespace

HiCacheService::HiCacheService(DaemonInfo info, const Clock* clock,
                               ServiceParts parts, StreamLimits limits)
    : info_(std::move(info)),
      clock_(clock),
      engine_(parts.engine),
      sessions_(parts.sessions),
      hub_(parts.hub),
      watch_(parts.watch),
      callers_(parts.callers),
      guard_(parts.group),
      group_(parts.group),
      group_status_(std::move(parts.group_status)),
      limits_(limits),
      kv_events_(parts.kv_events),
      flow_(parts.sessions, parts.engine, parts.hub) {}

Caller HiCacheService::CallerOf(const grpc::ServerContext* context) const {
  if (callers_ == nullptr) return Caller::Client("unidentified client");
  return callers_->Resolve(*context);
}

grpc::Status HiCacheService::CheckSessionCaller(
    const grpc::ServerContext* context, const std::string& session_id) const {
  return ToGrpcStatus(sessions_->CheckCaller(session_id, CallerOf(context)));
}

StreamContext HiCacheService::StreamContextFor(
    grpc::ServerContext* context) const {
  return StreamContext{.sessions = sessions_,
                       .hub = hub_,
                       .engine = engine_,
                       .max_backlog = limits_.max_backlog,
                       .on_overflow = [context] { context->TryCancel(); }};
}

v1::CacheEvent HiCacheService::ToCacheEvent(const OpEvent& event) {
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

grpc::Status HiCacheService::GetStats(
    grpc::ServerContext* /*context*/, const v1::GetStatsRequest* /*request*/,
    v1::GetStatsResponse* response) {
  ToProto(info_.build, response->mutable_build());
  response->set_backend(ToProto(info_.config.backend));
  ToProto(info_.config, response->mutable_geometry());
  const absl::Duration uptime = clock_->Now() - info_.start_time;
  response->set_uptime_seconds(absl::ToDoubleSeconds(uptime));
  response->set_start_time_unix(absl::ToUnixSeconds(info_.start_time));
  response->set_listen_address(info_.listen_address);
  response->set_pid(info_.pid);
  const DaemonConfig& c = info_.config;
  v1::EngineSettings* settings = response->mutable_settings();
  settings->set_write_policy(c.write_policy);
  settings->set_eviction_policy(c.eviction_policy);
  settings->set_write_through_threshold(c.write_through_threshold);
  settings->set_load_back_threshold_tokens(c.load_back_threshold_tokens);
  settings->set_l1_free_room_pages(c.l1_free_room_pages);
  settings->set_l2_free_room_pages(c.l2_free_room_pages);
  settings->set_transfer_workers(c.transfer_workers);
  settings->set_lock_host_memory(c.lock_host_memory);
  settings->set_pin_host_memory(c.pin_host_memory);
  settings->set_copy_max_blocks(c.copy_max_blocks);
  settings->mutable_gpus()->Add(c.gpus.begin(), c.gpus.end());
  settings->set_cuda_runtime(c.cuda_runtime);
  if (group_status_) {
    if (std::optional<group::GroupStatus> status = group_status_();
        status.has_value()) {
      ToProto(*status, group_ == nullptr ? "" : group_->LeaderAddress(),
              response->mutable_cp_group());
    }
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::OpenSession(grpc::ServerContext* context,
    const v1::OpenSessionRequest* request_in, v1::OpenSessionResponse* response) {
  const v1::OpenSessionRequest& request = *request_in;
  const Caller caller = CallerOf(context);
  if (request.client_name().empty()) {
    return Invalid("client_name must not be empty");
  }
  if (request.role() != v1::ROLE_SCHEDULER &&
      request.role() != v1::ROLE_WORKER) {
    return Invalid(absl::StrCat("role must be ROLE_SCHEDULER or ROLE_WORKER, got ",
                                request.role()));
  }
  if (request.role() == v1::ROLE_SCHEDULER) {
    if (grpc::Status s = guard_.Check(context, "OpenSession"); !s.ok()) {
      return s;
    }
  }
  const bool declares =
      !request.event_instance().empty() || !request.event_model().empty();
  if (declares && request.role() != v1::ROLE_SCHEDULER) {
    return Invalid("event_instance and event_model are for schedulers");
  }
  for (auto [field, value] :
       {std::pair{"event_instance", &request.event_instance()},
        std::pair{"event_model", &request.event_model()}}) {
    if (value->empty()) continue;
    if (absl::Status s = events::KvEventTopics::ValidateName(field, *value);
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  auto session = sessions_->Open(request.client_name(),
                                 request.role() == v1::ROLE_WORKER
                                     ? SessionRole::kWorker
                                     : SessionRole::kScheduler,
                                 request.rank(), request.namespace_(),
                                 absl::Milliseconds(request.lease_ms()),
                                 caller.principal);
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (declares && kv_events_ != nullptr) {
    const absl::Status declared = kv_events_->Declare(
        request.namespace_(), request.event_instance(), request.event_model());
    if (!declared.ok()) {
      // Nothing of the session is used yet: it goes again.
      if (absl::StatusOr<ReleaseSummary> closed = sessions_->Close(session->id);
          !closed.ok()) {
        spdlog::warn("closing session {} after a refused event declaration: {}",
                     session->id, closed.status().ToString());
      }
      return ToGrpcStatus(declared);
    }
  }
  response->set_session_id(session->id);
  response->set_lease_ms(absl::ToInt64Milliseconds(session->lease));
  return grpc::Status::OK;
}

grpc::Status HiCacheService::KeepAlive(grpc::ServerContext* context,
    const v1::KeepAliveRequest* request_in, v1::KeepAliveResponse* response) {
  const v1::KeepAliveRequest& request = *request_in;
  if (grpc::Status s = CheckSessionCaller(context, request.session_id());
      !s.ok()) {
    return s;
  }
  auto lease = sessions_->KeepAlive(request.session_id());
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  response->set_lease_ms(absl::ToInt64Milliseconds(*lease));
  return grpc::Status::OK;
}

grpc::Status HiCacheService::CloseSession(grpc::ServerContext* context,
    const v1::CloseSessionRequest* request_in, v1::CloseSessionResponse* response) {
  const v1::CloseSessionRequest& request = *request_in;
  if (grpc::Status s = CheckSessionCaller(context, request.session_id());
      !s.ok()) {
    return s;
  }
  auto summary = sessions_->Close(request.session_id());
  if (!summary.ok()) return ToGrpcStatus(summary.status());
  response->set_released_locks(summary->locks);
  response->set_freed_pages(summary->pages);
  response->set_rolled_back_backups(summary->backups);
  response->set_finished_loads(summary->loads);
  return grpc::Status::OK;
}

grpc::Status HiCacheService::GetLayout(grpc::ServerContext* context,
    const v1::GetLayoutRequest* request_in, v1::GetLayoutResponse* response) {
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
  // The ranks whose pools live here (a CP group's leader serves more).
  for (Rank r : engine_->pools().layout().served_ranks()) {
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

grpc::Status HiCacheService::RegisterFence(grpc::ServerContext* context,
    const v1::RegisterFenceRequest* request_in, v1::RegisterFenceResponse* response) {
  const v1::RegisterFenceRequest& request = *request_in;
  if (grpc::Status s = CheckSessionCaller(context, request.session_id());
      !s.ok()) {
    return s;
  }
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

grpc::Status HiCacheService::ReleaseFence(grpc::ServerContext* context,
    const v1::ReleaseFenceRequest* request_in, v1::ReleaseFenceResponse* response) {
  const v1::ReleaseFenceRequest& request = *request_in;
  if (grpc::Status s = CheckSessionCaller(context, request.session_id());
      !s.ok()) {
    return s;
  }
  return ToGrpcStatus(
      sessions_->ReleaseFence(request.session_id(), request.fence_id()));
}

}  // namespace hicache::service
