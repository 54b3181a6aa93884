#include "daemon/service/cache_service.h"

#include <cstring>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/service/proto_convert.h"

namespace hicache::service {
namespace {

constexpr size_t kMaxTokens = size_t{1} << 24;

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// Packed little-endian int32 tokens.
absl::StatusOr<std::vector<int32_t>> DecodeTokens(const std::string& bytes,
                                                  absl::string_view field) {
  if (bytes.size() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " has ", bytes.size(),
        " bytes; tokens are packed little-endian int32 (a multiple of 4)"));
  }
  if (bytes.size() / 4 > kMaxTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has more than ", kMaxTokens, " tokens"));
  }
  std::vector<int32_t> tokens(bytes.size() / 4);
  std::memcpy(tokens.data(), bytes.data(), bytes.size());
  return tokens;
}

void ToProto(absl::Span<const LogicalPage> pages, int64_t valid,
             v1::Locations* out) {
  out->mutable_pages()->Add(pages.begin(), pages.end());
  out->set_valid_tokens(valid);
}

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
                     EventHub* hub, WatchBroadcaster* watch)
    : engine_(engine), sessions_(sessions), hub_(hub), watch_(watch) {}

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

grpc::Status CacheRpcs::ListSessions(v1::ListSessionsResponse* response) {
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

grpc::Status CacheRpcs::Watch(grpc::ServerContext* context,
                              const v1::WatchRequest& request,
                              grpc::ServerWriter<v1::CacheEvent>* writer) {
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

grpc::Status CacheRpcs::OpenSession(const v1::OpenSessionRequest& request,
                                    v1::OpenSessionResponse* response) {
  if (request.client_name().empty()) {
    return Invalid("client_name must not be empty");
  }
  if (request.role() == v1::ROLE_UNSPECIFIED) {
    return Invalid("role must be ROLE_SCHEDULER or ROLE_WORKER");
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
      out->set_kind(exported.kind == PoolExport::Kind::kSharedMemory
                        ? "shm"
                        : "cuda_ipc");
    }
  }
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Allocate(const v1::AllocateRequest& request,
                                 v1::AllocateResponse* response) {
  std::vector<AllocationItem> items;
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::AllocateItem& in = request.items(i);
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
    if (in.mode() == v1::COMPUTE_OWNER_MODE_ZIGZAG)
      item.mode = ComputeOwnerMode::kZigzag;
    if (in.mode() == v1::COMPUTE_OWNER_MODE_ROUND_ROBIN) {
      item.mode = ComputeOwnerMode::kRoundRobin;
    }
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

grpc::Status CacheRpcs::MatchPrefix(const v1::MatchPrefixRequest& request,
                                    v1::MatchPrefixResponse* response) {
  std::vector<std::vector<int32_t>> requests;
  for (int i = 0; i < request.items_size(); ++i) {
    auto tokens = DecodeTokens(request.items(i).tokens(),
                               absl::StrCat("items[", i, "].tokens"));
    if (!tokens.ok()) return ToGrpcStatus(tokens.status());
    requests.push_back(*std::move(tokens));
  }
  auto results = sessions_->Match(request.session_id(), requests,
                                  request.lock(), request.peek());
  if (!results.ok()) return ToGrpcStatus(results.status());
  for (const MatchResult& r : *results) {
    v1::MatchResult* out = response->add_results();
    ToProto(r.device_pages, r.device_len, out->mutable_device());
    out->set_last_device_node(r.last_device_node);
    out->set_last_host_node(r.last_host_node);
    out->set_host_hit_tokens(r.host_hit_len);
  }
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Insert(const v1::InsertRequest& request,
                               v1::InsertResponse* response) {
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
    v1::InsertResult* out = response->add_results();
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
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::Lock(const v1::LockRequest& request, bool lock) {
  std::vector<NodeId> nodes(request.nodes().begin(), request.nodes().end());
  return ToGrpcStatus(lock ? sessions_->Lock(request.session_id(), nodes)
                           : sessions_->Unlock(request.session_id(), nodes));
}

grpc::Status CacheRpcs::LoadBack(
    grpc::ServerContext* context, const v1::LoadBackRequest& request,
    grpc::ServerWriter<v1::LoadBackEvent>* writer) {
  auto tokens = DecodeTokens(request.tokens(), "tokens");
  if (!tokens.ok()) return ToGrpcStatus(tokens.status());
  auto load = sessions_->LoadBack(request.session_id(), *tokens);
  if (!load.ok()) return ToGrpcStatus(load.status());
  v1::LoadBackEvent started;
  v1::LoadBackEvent::Started* s = started.mutable_started();
  s->set_load_id(load->op_id);
  ToProto(load->pages, load->device_len + load->loaded_len,
          s->mutable_locations());
  s->set_device_tokens(load->device_len);
  s->set_loaded_tokens(load->loaded_len);
  s->set_num_steps(load->num_steps);
  s->set_node(load->node);
  s->set_miss_reason(std::string(LoadMissReasonName(load->miss)));
  writer->Write(started);
  if (load->op_id == 0) return grpc::Status::OK;
  bool ok = false;
  while (!context->IsCancelled()) {
    std::optional<OpEvent> event =
        hub_->Next(load->op_id, absl::Milliseconds(200));
    if (!event.has_value()) continue;
    if (event->type == OpEvent::Type::kLoadStep) {
      v1::LoadBackEvent layer;
      layer.mutable_layer_loaded()->set_rank(event->rank);
      layer.mutable_layer_loaded()->set_step(event->step);
      writer->Write(layer);
    } else if (event->type == OpEvent::Type::kLoadDone) {
      ok = event->ok;
      break;
    }
  }
  hub_->Forget(load->op_id);
  // Hand the load's lock over to an ordinary session lock on the node.
  if (ok) (void)sessions_->Lock(request.session_id(), {load->node});
  (void)sessions_->FinishLoad(request.session_id(), load->op_id);
  v1::LoadBackEvent done;
  done.mutable_done()->set_ok(ok);
  writer->Write(done);
  return grpc::Status::OK;
}

grpc::Status CacheRpcs::BackupSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::BackupServerMessage, v1::BackupClientMessage>*
        stream) {
  Mutex mu;
  std::set<uint64_t> open_backups;  // GUARDED_BY(mu)
  bool reading = true;              // GUARDED_BY(mu)
  auto write = [&](const v1::BackupServerMessage& message) {
    MutexLock lock(&mu);
    stream->Write(message);
  };
  // Streams per-layer progress and commits of this stream's backups.
  std::thread events([&] {
    while (true) {
      std::vector<uint64_t> ids;
      {
        MutexLock lock(&mu);
        if (!reading && open_backups.empty()) return;
        ids.assign(open_backups.begin(), open_backups.end());
      }
      if (ids.empty() || context->IsCancelled()) {
        absl::SleepFor(absl::Milliseconds(1));
        if (context->IsCancelled()) return;
        continue;
      }
      for (uint64_t id : ids) {
        std::optional<OpEvent> event = hub_->Next(id, absl::Milliseconds(1));
        if (!event.has_value()) continue;
        v1::BackupServerMessage out;
        if (event->type == OpEvent::Type::kBackupStep) {
          out.mutable_step_done()->set_backup_id(id);
          out.mutable_step_done()->set_rank(event->rank);
          out.mutable_step_done()->set_step(event->step);
        } else if (event->type == OpEvent::Type::kCommitted) {
          out.mutable_committed()->set_backup_id(id);
          out.mutable_committed()->set_node(event->node);
        } else if (event->type == OpEvent::Type::kRolledBack) {
          out.mutable_rolled_back()->set_backup_id(id);
        } else {
          continue;
        }
        if (event->type != OpEvent::Type::kBackupStep) {
          MutexLock lock(&mu);
          open_backups.erase(id);
          hub_->Forget(id);
        }
        write(out);
      }
    }
  });
  std::string session;
  v1::BackupClientMessage in;
  grpc::Status result = grpc::Status::OK;
  while (stream->Read(&in)) {
    if (session.empty()) session = in.session_id();
    if (session.empty() ||
        (!in.session_id().empty() && in.session_id() != session)) {
      result = Invalid(
          "every BackupSession message must carry the stream's session_id");
      break;
    }
    absl::Status status;
    if (in.has_prepare()) {
      std::vector<BackupSpec> specs;
      for (const v1::BackupSpec& spec : in.prepare().specs()) {
        specs.push_back(
            {std::vector<LogicalPage>(spec.pages().begin(), spec.pages().end()),
             spec.logical_tokens()});
      }
      auto ids = sessions_->PrepareBackups(session, specs);
      status = ids.status();
      if (ids.ok()) {
        v1::BackupServerMessage out;
        out.mutable_prepared()->mutable_backup_ids()->Add(ids->begin(),
                                                          ids->end());
        {
          MutexLock lock(&mu);
          for (uint64_t id : *ids) {
            if (id != 0) open_backups.insert(id);
          }
        }
        write(out);
      }
    } else if (in.has_layer_stored()) {
      std::vector<uint64_t> ids(in.layer_stored().backup_ids().begin(),
                                in.layer_stored().backup_ids().end());
      status = sessions_->LayerStored(session, ids, in.layer_stored().step());
    } else if (in.has_store_all()) {
      status = sessions_->StoreAll(session, in.store_all().backup_id());
    } else if (in.has_rollback()) {
      status = sessions_->Rollback(session, in.rollback().backup_id());
    } else {
      status = absl::InvalidArgumentError("empty BackupClientMessage");
    }
    if (!status.ok()) {
      v1::BackupServerMessage error;
      error.mutable_error()->set_code(static_cast<int>(status.code()));
      error.mutable_error()->set_message(std::string(status.message()));
      write(error);
    }
  }
  {
    MutexLock lock(&mu);
    reading = false;
  }
  if (context->IsCancelled()) {
    // The stream broke: roll back what it left in flight.
    std::vector<uint64_t> ids;
    {
      MutexLock lock(&mu);
      ids.assign(open_backups.begin(), open_backups.end());
      open_backups.clear();
    }
    for (uint64_t id : ids) (void)sessions_->Rollback(session, id);
  }
  events.join();
  return result;
}

grpc::Status CacheRpcs::Pin(const v1::PinRequest& request) {
  return ToGrpcStatus(sessions_->Pin(request.session_id(), request.node(),
                                     absl::Milliseconds(request.ttl_ms())));
}

grpc::Status CacheRpcs::Evict(const v1::EvictRequest& request,
                              v1::EvictResponse* response) {
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

grpc::Status CacheRpcs::SetFreeRoom(const v1::SetFreeRoomRequest& request) {
  if (request.l1_pages_per_lane() < 0 || request.l2_pages_per_rank() < 0) {
    return Invalid("free-room targets must be >= 0");
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

grpc::Status CacheRpcs::DumpTree(const v1::DumpTreeRequest& request,
                                 v1::DumpTreeResponse* response) {
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

grpc::Status CacheRpcs::InspectNode(const v1::InspectNodeRequest& request,
                                    v1::NodeInfo* response) {
  auto info = engine_->Inspect(request.node());
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, response);
  return grpc::Status::OK;
}

}  // namespace hicache::service
