// HiCacheService: the operator RPCs, which act across tenants.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/core/le_bytes.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/proto_convert.h"
#include "daemon/service/rpc_util.h"
#include "spdlog/spdlog.h"

namespace hicache::service {
namespace {

// Operator-only RPCs act across tenants.
grpc::Status RequireOperator(const Caller& caller, absl::string_view rpc) {
  if (caller.is_operator) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
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

void ToProto(const NodeInfo& n, v1::NodeInfo* out) {
  out->set_id(n.id);
  out->set_parent(n.parent);
  out->set_namespace_(n.ns);
  out->set_depth(n.depth);
  out->set_start(n.start);
  out->set_length(n.len);
  out->mutable_head_tokens()->Add(n.head_tokens.begin(), n.head_tokens.end());
  out->mutable_tokens()->Add(n.tokens.begin(), n.tokens.end());
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
  out->set_idle_ms(n.idle_ms);
  out->set_storage_pages(n.storage_pages);
}

// Queries of one QueryTiers call, at most.
constexpr int kMaxTierQueries = 65536;

// --- DumpTree paging --------------------------------------------------------
// Nodes per page when the request names no limit, and the most it may ask.
constexpr int64_t kDefaultTreePage = 1000;
constexpr int64_t kMaxTreePage = 10000;
// A page ends before its serialized nodes pass this (gRPC's default receive
// limit is 4 MiB), unless it would otherwise be empty.
constexpr size_t kTreePageBytes = size_t{2} << 20;

// A continuation token: "HCT1", the sort, a fingerprint of the filter, then
// the position: for tree order the index of the next node; for the sorted
// orders the (key, id) of the last node returned. Web-safe base64 of 29
// bytes. The position is only ever a lower bound, so any value a client
// forges selects a (possibly empty) page; nothing in it is trusted further.
constexpr char kTokenMagic[] = "HCT1";
constexpr size_t kTokenBytes = 4 + 1 + 8 + 8 + 8;

struct TreeCursor {
  int64_t key = 0;  // Tree order: the next index. Sorted: the last key.
  uint64_t id = 0;  // Sorted: the last node id.
};

// FNV-1a over the filter fields, so a token cannot resume another query.
uint64_t FilterFingerprint(const v1::DumpTreeRequest& request) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](absl::string_view bytes) {
    for (unsigned char c : bytes) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;  // Field separator.
    h *= 1099511628211ull;
  };
  mix(request.namespace_());
  mix(request.all_namespaces() ? "1" : "0");
  mix(request.prefix());
  mix(absl::StrCat(request.max_depth() <= 0 ? -1 : request.max_depth()));
  return h;
}

std::string EncodeTreeToken(const v1::DumpTreeRequest& request,
                            const TreeCursor& cursor) {
  std::string raw;
  LeWriter w(&raw);
  w.Bytes(kTokenMagic);
  w.U8(static_cast<uint8_t>(request.sort()));
  w.U64(FilterFingerprint(request));
  w.I64(cursor.key);
  w.U64(cursor.id);
  return absl::WebSafeBase64Escape(raw);
}

absl::Status NotATreeToken() {
  return absl::InvalidArgumentError(
      "page_token is not a DumpTree continuation token; pass the "
      "next_page_token of the previous page unchanged");
}

absl::StatusOr<TreeCursor> DecodeTreeToken(const v1::DumpTreeRequest& request) {
  std::string raw;
  if (request.page_token().size() > 64 ||
      !absl::WebSafeBase64Unescape(request.page_token(), &raw) ||
      raw.size() != kTokenBytes) {
    return NotATreeToken();
  }
  LeReader in(raw);
  absl::string_view magic;
  uint8_t sort = 0;
  uint64_t fingerprint = 0;
  TreeCursor cursor;
  if (!in.Bytes(4, &magic) || magic != kTokenMagic || !in.U8(&sort) ||
      !in.U64(&fingerprint) || !in.I64(&cursor.key) || !in.U64(&cursor.id)) {
    return NotATreeToken();
  }
  if (sort != static_cast<uint8_t>(request.sort()) ||
      fingerprint != FilterFingerprint(request)) {
    return absl::InvalidArgumentError(
        "page_token belongs to another query: keep namespace, "
        "all_namespaces, prefix, max_depth and sort as on the first page");
  }
  if (request.sort() == v1::TREE_SORT_UNSPECIFIED && cursor.key < 0) {
    return absl::InvalidArgumentError("page_token holds a negative position");
  }
  return cursor;
}

// The sort key of a node: larger keys come first; ties go by ascending id.
int64_t SortKey(v1::TreeSort sort, const NodeInfo& n) {
  switch (sort) {
    case v1::TREE_SORT_HITS:
      return n.hit_count;
    case v1::TREE_SORT_RECENCY:
      return n.last_access_ns;
    case v1::TREE_SORT_TOKENS:
      return n.len;
    default:
      return 0;  // TREE_SORT_ID: the id alone.
  }
}

// Strict "a comes before b" in a sorted order.
bool Before(int64_t key_a, uint64_t id_a, int64_t key_b, uint64_t id_b) {
  return key_a != key_b ? key_a > key_b : id_a < id_b;
}

}  // namespace

grpc::Status HiCacheService::Evict(grpc::ServerContext* context,
                                   const v1::EvictRequest* request_in,
                                   v1::EvictResponse* response) {
  if (grpc::Status s = guard_.Check(context, "Evict"); !s.ok()) return s;
  const v1::EvictRequest& request = *request_in;
  const Caller caller = CallerOf(context);
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

grpc::Status HiCacheService::SetFreeRoom(
    grpc::ServerContext* context, const v1::SetFreeRoomRequest* request_in,
    v1::SetFreeRoomResponse* response) {
  if (grpc::Status s = guard_.Check(context, "SetFreeRoom"); !s.ok()) return s;
  const v1::SetFreeRoomRequest& request = *request_in;
  const Caller caller = CallerOf(context);
  if (grpc::Status s = RequireOperator(caller, "SetFreeRoom"); !s.ok()) {
    return s;
  }
  const absl::Status set = engine_->SetFreeRoom(request.l1_pages_per_lane(),
                                                request.l2_pages_per_rank());
  if (!set.ok()) return ToGrpcStatus(set);
  const auto [l1, l2] = engine_->FreeRoomTargets();
  response->set_l1_pages_per_lane(l1);
  response->set_l2_pages_per_rank(l2);
  return grpc::Status::OK;
}

void ToProto(const NamespaceQuota& q, v1::NamespaceQuota* out) {
  out->set_namespace_(q.ns);
  out->set_device_limit_pages(q.device_limit);
  out->set_device_guaranteed_pages(q.device_guaranteed);
  out->set_host_limit_pages(q.host_limit);
  out->set_host_guaranteed_pages(q.host_guaranteed);
}

grpc::Status HiCacheService::SetQuota(grpc::ServerContext* context,
                                      const v1::SetQuotaRequest* request,
                                      v1::SetQuotaResponse* response) {
  if (grpc::Status s = guard_.Check(context, "SetQuota"); !s.ok()) return s;
  const Caller caller = CallerOf(context);
  if (grpc::Status s = RequireOperator(caller, "SetQuota"); !s.ok()) return s;
  const v1::NamespaceQuota& in = request->quota();
  const NamespaceQuota quota{.ns = in.namespace_(),
                             .device_limit = in.device_limit_pages(),
                             .device_guaranteed = in.device_guaranteed_pages(),
                             .host_limit = in.host_limit_pages(),
                             .host_guaranteed = in.host_guaranteed_pages()};
  const SessionLimits& limits = sessions_->limits();
  if (static_cast<int64_t>(quota.ns.size()) > limits.max_name_bytes) {
    return Invalid(absl::StrCat("quota.namespace has ", quota.ns.size(),
                                " bytes; the limit is ",
                                limits.max_name_bytes));
  }
  if (!quota.empty()) {
    // One quota per namespace, at most --max_namespaces of them.
    int64_t set = 0;
    bool known = false;
    for (const NamespaceQuotaUsage& usage : engine_->NamespaceQuotas()) {
      if (usage.quota.empty()) continue;
      ++set;
      known |= usage.quota.ns == quota.ns;
    }
    if (!known && set >= limits.max_namespaces) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat(set,
                                       " namespaces have quotas, the limit "
                                       "(--max_namespaces)"));
    }
  }
  if (absl::Status s = engine_->SetNamespaceQuota(quota); !s.ok()) {
    return ToGrpcStatus(s);
  }
  spdlog::info("quota of namespace '{}' set by {}: {}", quota.ns, caller.name,
               FormatNamespaceQuota(quota));
  ToProto(quota, response->mutable_quota());
  return grpc::Status::OK;
}

grpc::Status HiCacheService::ListQuotas(grpc::ServerContext* context,
                                        const v1::ListQuotasRequest*,
                                        v1::ListQuotasResponse* response) {
  if (grpc::Status s = guard_.Check(context, "ListQuotas"); !s.ok()) return s;
  const Caller caller = CallerOf(context);
  if (grpc::Status s = RequireOperator(caller, "ListQuotas"); !s.ok()) {
    return s;
  }
  for (const NamespaceQuotaUsage& usage : engine_->NamespaceQuotas()) {
    v1::NamespaceQuotaUsage* out = response->add_namespaces();
    ToProto(usage.quota, out->mutable_quota());
    out->set_device_cached_pages(usage.device_cached_pages);
    out->set_device_request_pages(usage.device_request_pages);
    out->set_host_pages(usage.host_pages);
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::Stats(grpc::ServerContext* context,
                                   const v1::GetStatsRequest* request_in,
                                   v1::CacheStats* out) {
  if (grpc::Status s = guard_.Check(context, "Stats"); !s.ok()) return s;
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
  out->set_backups_failed(s.backups_failed);
  out->set_backups_skipped_no_host(s.backups_skipped_no_host);
  out->set_loads_started(s.loads_started);
  out->set_loads_done(s.loads_done);
  out->set_load_misses(s.load_misses);
  out->set_device_evicted_pages(s.device_evicted_pages);
  out->set_host_evicted_pages(s.host_evicted_pages);
  out->set_host_copies_dropped(s.host_copies_dropped);
  out->set_write_back_rejected(s.write_back_rejected);
  out->set_copy_waits(s.copy_waits);
  out->set_write_ahead_backups(s.write_ahead_backups);
  out->set_device_alloc_failures(s.device_alloc_failures);
  out->set_quota_refusals(s.quota_refusals);
  out->set_backups_skipped_quota(s.backups_skipped_quota);
  out->set_quota_evicted_pages(s.quota_evicted_pages);
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
  const auto [l1_free_room, l2_free_room] = engine_->FreeRoomTargets();
  out->set_l1_free_room_pages(l1_free_room);
  out->set_l2_free_room_pages(l2_free_room);
  out->set_free_room_reported(true);
  out->set_storage_hit_tokens(s.storage_hit_tokens);
  if (const StorageTierReport st = engine_->StorageReport(); st.enabled) {
    v1::StorageTierStats* storage = out->mutable_storage();
    storage->set_enabled(true);
    for (const std::string& store : st.stores) storage->add_stores(store);
    storage->set_capacity_pages(st.capacity_pages);
    storage->set_used_pages(st.used_pages);
    storage->set_pages_queued(st.pages_queued);
    storage->set_pages_dropped(st.pages_dropped);
    storage->set_pages_written(st.pages_written);
    storage->set_write_errors(st.write_errors);
    storage->set_pages_read(st.pages_read);
    storage->set_read_failures(st.read_failures);
    storage->set_checksum_failures(st.checksum_failures);
    storage->set_evictions(st.evictions);
    storage->set_bytes_written(st.bytes_written);
    storage->set_bytes_read(st.bytes_read);
    storage->set_lookups(s.storage_lookups);
    storage->set_hit_pages(s.storage_hit_pages);
    storage->set_promoted_pages(s.storage_promoted_pages);
    storage->set_promotions_failed(s.storage_promotions_failed);
    storage->set_promotions_skipped(s.storage_promotions_skipped);
    storage->set_refused_cost(s.storage_refused_cost);
    storage->set_read_ns_per_byte(st.read_ns_per_byte);
    storage->set_prefetches_started(st.prefetches_started);
    storage->set_prefetches_dropped(st.prefetches_dropped);
    storage->set_prefetch_waits_timed_out(st.prefetch_waits_timed_out);
  }
  if (const HostTierPersistence p = engine_->Persistence(); p.enabled) {
    v1::HostTierPersistence* persistence = out->mutable_persistence();
    persistence->set_enabled(true);
    persistence->set_recovered(p.recovered);
    persistence->set_cold_reason(p.cold_reason);
    persistence->set_nodes_recovered(p.nodes_recovered);
    persistence->set_pages_recovered(p.pages_recovered);
    persistence->set_dropped_checksum(p.dropped_checksum);
    persistence->set_dropped_orphan(p.dropped_orphan);
    persistence->set_dropped_conflict(p.dropped_conflict);
    persistence->set_verified_bytes(p.verified_bytes);
    persistence->set_recovery_seconds(absl::ToDoubleSeconds(p.recovery_time));
    persistence->set_load_seconds(absl::ToDoubleSeconds(p.load_time));
    persistence->set_verify_seconds(absl::ToDoubleSeconds(p.verify_time));
    persistence->set_restore_seconds(absl::ToDoubleSeconds(p.restore_time));
    persistence->set_journal_puts(p.journal_puts);
    persistence->set_journal_puts_refused(p.journal_puts_refused);
    persistence->set_journal_stopped(p.journal_stopped);
    persistence->set_journal_backlog_events(p.journal_backlog_events);
    persistence->set_journal_not_durable_records(p.journal_not_durable_records);
    persistence->set_journal_live(p.journal_live);
    persistence->set_journal_file_bytes(p.journal_file_bytes);
    persistence->set_journal_status(p.journal_status);
  }
  const SessionManager::Totals totals = sessions_->totals();
  out->set_sessions(totals.sessions);
  out->set_session_locks(totals.locks);
  out->set_session_pages(totals.pages);
  return grpc::Status::OK;
}

grpc::Status HiCacheService::QueryTiers(grpc::ServerContext* context,
                                        const v1::QueryTiersRequest* request_in,
                                        v1::QueryTiersResponse* response) {
  if (grpc::Status s = guard_.Check(context, "QueryTiers"); !s.ok()) return s;
  const v1::QueryTiersRequest& request = *request_in;
  // With a session: confined to its namespace. Without: operators only.
  std::optional<std::string> session_ns;
  if (!request.session_id().empty()) {
    if (grpc::Status s = CheckSessionCaller(context, request.session_id());
        !s.ok()) {
      return s;
    }
    absl::StatusOr<SessionInfo> info = sessions_->Info(request.session_id());
    if (!info.ok()) return ToGrpcStatus(info.status());
    if (info->role != SessionRole::kScheduler) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "QueryTiers is for schedulers and operators");
    }
    session_ns = info->ns;
  } else if (grpc::Status s = RequireOperator(CallerOf(context), "QueryTiers");
             !s.ok()) {
    return s;
  }
  if (request.queries_size() > kMaxTierQueries) {
    return Invalid(absl::StrCat("the call carries ", request.queries_size(),
                                " queries; the limit is ", kMaxTierQueries));
  }
  if (grpc::Status s = CheckTokenBudget(
          request.queries(), sessions_->limits().max_tokens_per_request);
      !s.ok()) {
    return s;
  }
  std::vector<std::vector<int32_t>> tokens;
  tokens.reserve(request.queries_size());
  std::vector<HiCacheEngine::TierQuery> queries;
  queries.reserve(request.queries_size());
  for (int i = 0; i < request.queries_size(); ++i) {
    const v1::TierQuery& q = request.queries(i);
    if (session_ns.has_value() && !q.namespace_().empty() &&
        q.namespace_() != *session_ns) {
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("queries[", i,
                                       "] names another namespace than the "
                                       "session's"));
    }
    auto decoded =
        DecodeTokens(q.tokens(), absl::StrCat("queries[", i, "].tokens"));
    if (!decoded.ok()) return ToGrpcStatus(decoded.status());
    tokens.push_back(*std::move(decoded));
  }
  for (int i = 0; i < request.queries_size(); ++i) {
    queries.push_back({session_ns.has_value()
                           ? absl::string_view(*session_ns)
                           : absl::string_view(request.queries(i).namespace_()),
                       tokens[i]});
  }
  for (const HiCacheEngine::TierHit& hit : engine_->QueryTiers(queries)) {
    v1::TierHit* out = response->add_hits();
    out->set_device_tokens(hit.device_tokens);
    out->set_host_tokens(hit.host_tokens);
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::DumpTree(grpc::ServerContext* context,
                                      const v1::DumpTreeRequest* request_in,
                                      v1::DumpTreeResponse* response) {
  if (grpc::Status s = guard_.Check(context, "DumpTree"); !s.ok()) return s;
  const v1::DumpTreeRequest& request = *request_in;
  const Caller caller = CallerOf(context);
  if (grpc::Status s = RequireOperator(caller, "DumpTree"); !s.ok()) return s;
  auto prefix = DecodeTokens(request.prefix(), "prefix");
  if (!prefix.ok()) return ToGrpcStatus(prefix.status());
  DumpFilter filter;
  filter.ns = request.namespace_();
  filter.all_namespaces = request.all_namespaces();
  filter.prefix = *std::move(prefix);
  filter.max_depth = request.max_depth() <= 0 ? -1 : request.max_depth();
  filter.include_tokens = request.include_tokens();
  if (!v1::TreeSort_IsValid(request.sort())) {
    return Invalid(absl::StrCat("unknown sort ", request.sort()));
  }
  // limit <= 0 is the default page (before paging, it meant "every node").
  const int64_t page = request.limit() <= 0
                           ? kDefaultTreePage
                           : std::min(request.limit(), kMaxTreePage);
  const v1::TreeSort sort = request.sort();
  const bool tree_order = sort == v1::TREE_SORT_UNSPECIFIED;
  std::optional<TreeCursor> cursor;
  if (!request.page_token().empty()) {
    absl::StatusOr<TreeCursor> decoded = DecodeTreeToken(request);
    if (!decoded.ok()) return ToGrpcStatus(decoded.status());
    cursor = *decoded;
  }
  // The whole matching set, sorted, then one page of it: sorting must see
  // every node, not only the first `limit` (the engine lock is held only for
  // the copy).
  std::vector<NodeInfo> nodes = engine_->Dump(filter);
  response->set_total_nodes(static_cast<int64_t>(nodes.size()));
  size_t begin = 0;
  if (!tree_order) {
    std::sort(nodes.begin(), nodes.end(),
              [sort](const NodeInfo& a, const NodeInfo& b) {
                return Before(SortKey(sort, a), a.id, SortKey(sort, b), b.id);
              });
    if (cursor.has_value()) {
      // First node strictly after the cursor; strictly increasing cursors
      // make paging end even while the tree changes.
      begin = std::partition_point(nodes.begin(), nodes.end(),
                                   [&](const NodeInfo& n) {
                                     return !Before(cursor->key, cursor->id,
                                                    SortKey(sort, n), n.id);
                                   }) -
              nodes.begin();
    }
  } else if (cursor.has_value()) {
    begin = static_cast<size_t>(
        std::min<int64_t>(cursor->key, static_cast<int64_t>(nodes.size())));
  }
  size_t end = begin;
  size_t bytes = 0;
  while (end < nodes.size() && static_cast<int64_t>(end - begin) < page) {
    v1::NodeInfo out;
    ToProto(nodes[end], &out);
    const size_t size = out.ByteSizeLong() + 8;  // + tag and length.
    if (end > begin && bytes + size > kTreePageBytes) break;
    bytes += size;
    *response->add_nodes() = std::move(out);
    ++end;
  }
  if (end < nodes.size()) {
    TreeCursor next;
    if (tree_order) {
      next.key = static_cast<int64_t>(end);
    } else {
      next.key = SortKey(sort, nodes[end - 1]);
      next.id = nodes[end - 1].id;
    }
    response->set_next_page_token(EncodeTreeToken(request, next));
  }
  return grpc::Status::OK;
}

grpc::Status HiCacheService::InspectNode(
    grpc::ServerContext* context, const v1::InspectNodeRequest* request_in,
    v1::NodeInfo* response) {
  if (grpc::Status s = guard_.Check(context, "InspectNode"); !s.ok()) return s;
  const v1::InspectNodeRequest& request = *request_in;
  const Caller caller = CallerOf(context);
  if (grpc::Status s = RequireOperator(caller, "InspectNode"); !s.ok()) {
    return s;
  }
  auto info = engine_->Inspect(request.node());
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, response);
  return grpc::Status::OK;
}

grpc::Status HiCacheService::ListSessions(
    grpc::ServerContext* context, const v1::ListSessionsRequest* request_in,
    v1::ListSessionsResponse* response) {
  const Caller caller = CallerOf(context);
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

grpc::Status HiCacheService::Watch(grpc::ServerContext* context,
                                   const v1::WatchRequest* request_in,
                                   grpc::ServerWriter<v1::CacheEvent>* writer) {
  if (grpc::Status s = guard_.Check(context, "Watch"); !s.ok()) return s;
  const v1::WatchRequest& request = *request_in;
  const Caller caller = CallerOf(context);
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
}  // namespace hicache::service
