#include "client/ctl/cache_commands.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/cpp/hicache_client.h"
#include "client/cpp/leader_redirect.h"
#include "client/ctl/cli.h"
#include "client/ctl/command_support.h"
#include "client/ctl/output_format.h"
#include "client/ctl/rpc_error.h"
#include "grpcpp/client_context.h"

namespace hicache::ctl {
namespace {

// "1,2,3" or "1 2 3".
std::optional<std::vector<int32_t>> ParseTokens(const std::string& text) {
  std::vector<int32_t> tokens;
  for (absl::string_view part :
       absl::StrSplit(text, absl::ByAnyChar(", \n\t\r"), absl::SkipEmpty())) {
    int32_t token = 0;
    if (!absl::SimpleAtoi(part, &token)) return std::nullopt;
    tokens.push_back(token);
  }
  return tokens;
}

std::string Pack(const std::vector<int32_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()),
                     tokens.size() * 4);
}

int AbslError(const absl::Status& status, const CommandContext& c) {
  return RpcError(grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                               std::string(status.message())),
                  c, client::LeaderOf(status).value_or(""));
}

std::string Tokens(const google::protobuf::RepeatedField<int32_t>& tokens) {
  return absl::StrJoin(tokens, ",");
}

// A short-lived scheduler session for commands that need one.
class TempSession {
 public:
  TempSession(v1::HiCache::Stub* stub, const CommandContext& c,
              const std::string& ns)
      : stub_(stub), c_(c) {
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    v1::OpenSessionRequest request;
    request.set_client_name("hicachectl");
    request.set_role(v1::ROLE_SCHEDULER);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    status_ = stub_->OpenSession(&ctx, request, &response);
    leader_ = LeaderOfCall(status_, ctx);
    id_ = response.session_id();
  }
  ~TempSession() {
    if (!status_.ok()) return;
    grpc::ClientContext ctx;
    Deadline(&ctx, c_.timeout);
    v1::CloseSessionRequest request;
    request.set_session_id(id_);
    v1::CloseSessionResponse response;
    const grpc::Status closed = stub_->CloseSession(&ctx, request, &response);
    // The lease expires anyway; say so rather than drop the error.
    if (!closed.ok()) {
      *c_.err << "hicachectl: warning: closing the temporary session failed ("
              << GrpcCodeName(closed.error_code())
              << "); the daemon drops it when its lease lapses\n";
    }
  }
  const grpc::Status& status() const { return status_; }
  // The CP group leader a refused OpenSession named ("" if none).
  const std::string& leader() const { return leader_; }
  const std::string& id() const { return id_; }

 private:
  v1::HiCache::Stub* stub_;
  const CommandContext& c_;
  grpc::Status status_;
  std::string id_;
  std::string leader_;
};

void PrintNodeLine(const v1::NodeInfo& n, bool indent,
                   const CommandContext& c) {
  std::vector<uint32_t> owners(n.page_owners().begin(), n.page_owners().end());
  *c.out << std::string(indent ? 2 * std::max(0, n.depth() - 1) : 0, ' ')
         << absl::StrFormat(
                "#%d [%s%s%s] len=%d %s%s lock=%d host_ref=%d hits=%d%s "
                "owners=%s%s\n",
                n.id(), Tokens(n.head_tokens()), n.length() > 4 ? ".." : "",
                n.length() > 4 ? Tokens(n.tail_tokens()) : "", n.length(),
                n.tier(), n.pending_backup() ? "+pending" : "", n.lock_ref(),
                n.host_ref(), n.hits(),
                n.pin_remaining_ms() > 0
                    ? absl::StrCat(" pin=", n.pin_remaining_ms(), "ms")
                    : "",
                CompactOwners(owners),
                n.namespace_().empty() ? ""
                                       : absl::StrCat(" ns=", n.namespace_()));
}

}  // namespace

std::optional<v1::TreeSort> ParseTreeSort(const std::string& word) {
  if (word == "tree") return v1::TREE_SORT_UNSPECIFIED;
  if (word == "hits") return v1::TREE_SORT_HITS;
  if (word == "recency") return v1::TREE_SORT_RECENCY;
  if (word == "tokens" || word == "len") return v1::TREE_SORT_TOKENS;
  if (word == "id") return v1::TREE_SORT_ID;
  return std::nullopt;
}

int RunHealth(const HealthOptions& options, const CommandContext& c) {
  client::HiCacheClient client(c.channel);
  absl::StatusOr<client::ServingStatus> health =
      client.CheckHealth(options.service, c.timeout);
  if (!health.ok()) return AbslError(health.status(), c);
  const char* name = client::ServingStatusName(*health);
  if (c.json) {
    Json doc = Json::object();
    doc["status"] = name;
    doc["service"] = options.service;
    doc["target"] = c.target;
    PrintJson(doc, c);
  } else {
    *c.out << name << "\n";
  }
  return *health == client::ServingStatus::kServing ? kExitOk : kExitFailure;
}

int RunStats(const CommandContext& c) {
  client::HiCacheClient client(c.channel);
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats(c.timeout);
  if (!stats.ok()) return AbslError(stats.status(), c);
  // Then the cache: pools per lane, hit rates, backups, loads, evictions.
  // A CP group follower keeps no tree (the leader does; it refuses Stats),
  // so it shows none.
  const bool follower =
      stats->has_cp_group() && stats->cp_group().role() == "follower";
  if (!c.json) {
    *c.out << FormatStatsHuman(*stats) << "\n";
    if (follower) {
      const std::string& leader = stats->cp_group().leader_address();
      *c.out << "cache          kept by the CP group leader"
             << (leader.empty()
                     ? std::string(" (not known yet)")
                     : absl::StrCat(" (hicachectl --target ",
                                    absl::CHexEscape(leader), " cache-stats)"))
             << "\n";
      return kExitOk;
    }
    return RunCacheStats(c);
  }
  if (follower) {
    Json doc = Json::object();
    doc["daemon"] = StatsToJson(*stats);
    PrintJson(doc, c);
    return kExitOk;
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::CacheStats cache;
  const grpc::Status status =
      Stub(c)->Stats(&ctx, v1::GetStatsRequest(), &cache);
  if (!status.ok()) return RpcError(status, ctx, c);
  Json doc = Json::object();
  doc["daemon"] = StatsToJson(*stats);
  doc["cache"] = ProtoToJson(cache);
  PrintJson(doc, c);
  return kExitOk;
}

int RunTree(const TreeOptions& o, const CommandContext& c) {
  std::optional<v1::TreeSort> sort = ParseTreeSort(o.sort);
  if (!sort.has_value()) {
    return Usage(c, "--sort is one of tree, hits, recency, tokens, id");
  }
  v1::DumpTreeRequest request;
  request.set_namespace_(o.ns.value_or(""));
  request.set_all_namespaces(!o.ns.has_value());
  request.set_max_depth(o.depth);
  request.set_limit(o.limit);
  request.set_sort(*sort);
  if (!o.prefix.empty()) {
    auto prefix = ParseTokens(o.prefix);
    if (!prefix.has_value()) {
      return Usage(c, "--prefix takes token ids like 1,2,3");
    }
    request.set_prefix(Pack(*prefix));
  }
  request.set_page_token(o.page_token);
  auto stub = Stub(c);
  v1::DumpTreeResponse all;
  for (;;) {
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    v1::DumpTreeResponse page;
    const grpc::Status status = stub->DumpTree(&ctx, request, &page);
    if (!status.ok()) return RpcError(status, ctx, c);
    for (v1::NodeInfo& n : *page.mutable_nodes()) {
      *all.add_nodes() = std::move(n);
    }
    if (page.nodes_size() > 0 && page.total_nodes() == 0) {
      // A daemon from before paging: it neither sorts nor pages (and
      // returns every node when no --limit is given).
      *c.err << "hicachectl: warning: this hicached does not sort or page "
                "the tree (it is older than hicachectl); nodes are in tree "
                "order\n";
    }
    all.set_total_nodes(page.total_nodes());
    all.set_next_page_token(page.next_page_token());
    if (!o.all || page.next_page_token().empty()) break;
    if (page.next_page_token() == request.page_token()) {
      *c.err << "hicachectl: the daemon returned the same page token twice; "
                "stopping\n";
      return kExitFailure;
    }
    request.set_page_token(page.next_page_token());
  }
  if (c.json) {
    PrintJson(ProtoToJson(all), c);
    return kExitOk;
  }
  if (all.nodes().empty()) *c.out << "(empty)\n";
  for (const v1::NodeInfo& n : all.nodes()) {
    PrintNodeLine(n, *sort == v1::TREE_SORT_UNSPECIFIED, c);
  }
  if (!all.next_page_token().empty()) {
    *c.out << "(" << all.nodes_size() << " of " << all.total_nodes()
           << " nodes shown; next page: --page_token=" << all.next_page_token()
           << ", or --all for every page)\n";
  }
  return kExitOk;
}

int RunNode(uint64_t node, const CommandContext& c) {
  if (node == 0) return Usage(c, "node takes a node id > 0");
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::InspectNodeRequest request;
  request.set_node(node);
  v1::NodeInfo n;
  const grpc::Status status = Stub(c)->InspectNode(&ctx, request, &n);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (c.json) {
    PrintJson(ProtoToJson(n), c);
    return kExitOk;
  }
  *c.out << absl::StrFormat(
      "node %d (parent %d, namespace '%s', depth %d)\ntokens   %d..%d (%d)\n"
      "tier     %s%s\nlock     %d, host_ref %d, hits %d, priority %d, pin "
      "%dms, idle %dms\n",
      n.id(), n.parent(), n.namespace_(), n.depth(), n.start(),
      n.start() + n.length(), n.length(), n.tier(),
      n.pending_backup() ? " (backup in flight)" : "", n.lock_ref(),
      n.host_ref(), n.hits(), n.priority(), n.pin_remaining_ms(), n.idle_ms());
  for (int i = 0; i < n.page_owners_size(); ++i) {
    *c.out << absl::StrFormat("page %-3d owner %d", i, n.page_owners(i));
    if (i < n.device_pages_size()) *c.out << " device " << n.device_pages(i);
    *c.out << "\n";
  }
  for (int r = 0; r < n.host_pages_by_rank_size(); ++r) {
    *c.out << "host rank " << r << ": "
           << absl::StrJoin(n.host_pages_by_rank(r).pages(), ",") << "\n";
  }
  return kExitOk;
}

int RunMatch(const MatchOptions& o, const CommandContext& c) {
  if (!o.file.empty() && !o.tokens.empty()) {
    return Usage(c, "match takes token ids or --file F, not both");
  }
  std::string text;
  if (!o.file.empty()) {
    std::ifstream in(o.file);
    if (!in) return Usage(c, "--file: cannot read '" + o.file + "'");
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  } else {
    text = absl::StrJoin(o.tokens, ",");
  }
  auto tokens = ParseTokens(text);
  if (!tokens.has_value() || tokens->empty()) {
    return Usage(c, "match takes token ids (1,2,3) or --file F");
  }
  auto stub = Stub(c);
  TempSession session(stub.get(), c, o.ns);
  if (!session.status().ok()) {
    return RpcError(session.status(), c, session.leader());
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::MatchPrefixRequest request;
  request.set_session_id(session.id());
  request.set_peek(true);  // Inspection: counts no hit, starts no backup.
  request.add_items()->set_tokens(Pack(*tokens));
  v1::MatchPrefixResponse response;
  const grpc::Status status = stub->MatchPrefix(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (response.results_size() != 1) {
    *c.err << "hicachectl: the daemon answered " << response.results_size()
           << " results for one query\n";
    return kExitFailure;
  }
  if (c.json) {
    PrintJson(ProtoToJson(response), c);
    return kExitOk;
  }
  const v1::MatchResult& r = response.results(0);
  *c.out << absl::StrFormat(
      "query     %d tokens\ndevice    %d tokens in %d pages (node %d)\n"
      "host      %d more tokens (node %d)\nmiss      %d tokens\n",
      tokens->size(), r.device().valid_tokens(), r.device().pages_size(),
      r.last_device_node(), r.host_hit_tokens(), r.last_host_node(),
      static_cast<int64_t>(tokens->size()) - r.device().valid_tokens() -
          r.host_hit_tokens());
  return kExitOk;
}

int RunTiers(const TiersOptions& o, const CommandContext& c) {
  if (!o.file.empty() && !o.tokens.empty()) {
    return Usage(c, "tiers takes token ids or --file F, not both");
  }
  std::vector<std::string> lines;
  if (!o.file.empty()) {
    std::ifstream in(o.file);
    if (!in) return Usage(c, "--file: cannot read '" + o.file + "'");
    for (std::string line; std::getline(in, line);) {
      if (!absl::StripAsciiWhitespace(line).empty()) lines.push_back(line);
    }
  } else {
    lines.push_back(absl::StrJoin(o.tokens, ","));
  }
  v1::QueryTiersRequest request;
  for (const std::string& line : lines) {
    auto tokens = ParseTokens(line);
    if (!tokens.has_value() || tokens->empty()) {
      return Usage(c, "tiers takes token ids (1,2,3) or --file F with one "
                      "sequence per line");
    }
    v1::TierQuery* query = request.add_queries();
    query->set_namespace_(o.ns);
    query->set_tokens(Pack(*tokens));
  }
  auto stub = Stub(c);
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::QueryTiersResponse response;
  const grpc::Status status = stub->QueryTiers(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (c.json) {
    PrintJson(ProtoToJson(response), c);
    return kExitOk;
  }
  for (int i = 0; i < response.hits_size(); ++i) {
    const int64_t total = static_cast<int64_t>(request.queries(i).tokens().size() / 4);
    *c.out << absl::StrFormat("%d\tdevice %d\thost %d\tmiss %d\n", i,
                              response.hits(i).device_tokens(),
                              response.hits(i).host_tokens(),
                              total - response.hits(i).device_tokens() -
                                  response.hits(i).host_tokens());
  }
  return kExitOk;
}

int RunCacheStats(const CommandContext& c) {
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::CacheStats s;
  const grpc::Status status = Stub(c)->Stats(&ctx, v1::GetStatsRequest(), &s);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (c.json) {
    PrintJson(ProtoToJson(s), c);
    return kExitOk;
  }
  auto pct = [](int64_t part, int64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * part / whole;
  };
  *c.out << absl::StrFormat(
      "tree       %d nodes; device %d tokens (%d locked, %d evictable); host "
      "%d tokens; %d backups in flight\n"
      "hits       %d queries, %d tokens: device %.1f%%, host %.1f%%\n"
      "backups    %d started, %d committed, %d rolled back, %d skipped (host "
      "full)\n"
      "loads      %d started, %d done, %d missed\n"
      "evictions  %d device pages, %d host pages; %d allocation failures\n"
      "moved      %d bytes to host, %d bytes to device\n"
      "sessions   %d (%d locks, %d pages)\n",
      s.nodes(), s.device_tokens(), s.protected_tokens(), s.evictable_tokens(),
      s.host_tokens(), s.pending_backups(), s.match_calls(), s.query_tokens(),
      pct(s.device_hit_tokens(), s.query_tokens()),
      pct(s.host_hit_tokens(), s.query_tokens()), s.backups_started(),
      s.backups_committed(), s.backups_rolled_back(),
      s.backups_skipped_no_host(), s.loads_started(), s.loads_done(),
      s.load_misses(), s.device_evicted_pages(), s.host_evicted_pages(),
      s.device_alloc_failures(), s.bytes_to_host(), s.bytes_to_device(),
      s.sessions(), s.session_locks(), s.session_pages());
  if (s.backups_failed() > 0) {
    // Shown only when there are some (a failed copy, or a CP group
    // member's lanes dropped at its death).
    *c.out << absl::StrFormat(
        "failed     %d backups ended by a failed copy or a dropped lane\n",
        s.backups_failed());
  }
  if (s.has_persistence() && s.persistence().enabled()) {
    const v1::HostTierPersistence& p = s.persistence();
    if (p.recovered()) {
      *c.out << absl::StrFormat(
          "restart    host tier recovered in %.3f s (load %.3f, verify %.3f, "
          "restore %.3f): %d nodes, %d pages (%d bytes verified); dropped %d "
          "(checksum), %d (parent gone), %d (conflict)\n",
          p.recovery_seconds(), p.load_seconds(), p.verify_seconds(),
          p.restore_seconds(), p.nodes_recovered(), p.pages_recovered(),
          p.verified_bytes(), p.dropped_checksum(), p.dropped_orphan(),
          p.dropped_conflict());
    } else {
      *c.out << "restart    cold: " << p.cold_reason() << "\n";
    }
    *c.out << absl::StrFormat(
        "journal    %s; %d host copies recorded since the start, %d a "
        "restart would recover, %d bytes\n",
        p.journal_status(), p.journal_puts(), p.journal_live(),
        p.journal_file_bytes());
    if (p.journal_puts_refused() > 0) {
      *c.out << absl::StrFormat(
          "journal    %d host copies not recorded: the journal was too far "
          "behind\n",
          p.journal_puts_refused());
    }
    if (p.journal_backlog_events() > 0 || p.journal_not_durable_records() > 0) {
      *c.out << absl::StrFormat(
          "journal    not durable yet: %d host-tier changes the recorder has "
          "not handled, %d records not synced\n",
          p.journal_backlog_events(), p.journal_not_durable_records());
    }
  }
  if (s.has_storage() && s.storage().enabled()) {
    const v1::StorageTierStats& t = s.storage();
    *c.out << absl::StrFormat(
        "storage    %d of %d pages; %d tokens hit past the host tier; %d "
        "pages promoted (%d promotions failed, %d skipped, %d refused by "
        "the cost model at %.2f ns/byte)\n"
        "storage    %d pages written (%d dropped, %d failed), %d read (%d "
        "failed, %d checksum failures), %d evicted\n",
        t.used_pages(), t.capacity_pages(), s.storage_hit_tokens(),
        t.promoted_pages(), t.promotions_failed(), t.promotions_skipped(),
        t.refused_cost(), t.read_ns_per_byte(), t.pages_written(),
        t.pages_dropped(), t.write_errors(), t.pages_read(),
        t.read_failures(), t.checksum_failures(), t.evictions());
    for (const std::string& store : t.stores()) {
      *c.out << "storage    " << store << "\n";
    }
  }
  *c.out << "lane  device free  release  used   host free  used\n";
  for (const v1::LaneStats& l : s.lanes()) {
    *c.out << absl::StrFormat("%-5d %11d  %7d  %5d   %9d  %4d\n", l.lane(),
                              l.free(), l.release(), l.allocated(),
                              l.host_free(), l.host_used());
  }
  return kExitOk;
}

int RunSessions(const CommandContext& c) {
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::ListSessionsResponse response;
  const grpc::Status status =
      Stub(c)->ListSessions(&ctx, v1::ListSessionsRequest(), &response);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (c.json) {
    PrintJson(ProtoToJson(response), c);
    return kExitOk;
  }
  if (response.sessions().empty()) *c.out << "(no sessions)\n";
  for (const v1::SessionSummary& s : response.sessions()) {
    *c.out << absl::StrFormat(
        "%s  %-20s %-9s rank %d  ns '%s'  lease %dms\n", s.session_id(),
        s.client_name(), s.role() == v1::ROLE_WORKER ? "worker" : "scheduler",
        s.rank(), s.namespace_(), s.lease_ms());
  }
  return kExitOk;
}

int RunEvict(const EvictOptions& o, const CommandContext& c) {
  if (o.device.empty() && o.host.empty()) {
    return Usage(c, "evict needs --device N[,N...] and/or --host N[,N...]");
  }
  v1::EvictRequest request;
  for (int64_t n : o.device) {
    if (n < 0) return Usage(c, "--device takes page counts >= 0, e.g. 8,8");
    request.add_device_pages_per_lane(n);
  }
  for (int64_t n : o.host) {
    if (n < 0) return Usage(c, "--host takes page counts >= 0, e.g. 8,8");
    request.add_host_pages_per_rank(n);
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::EvictResponse response;
  const grpc::Status status = Stub(c)->Evict(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (c.json) {
    PrintJson(ProtoToJson(response), c);
    return kExitOk;
  }
  *c.out << "evicted " << response.device_pages_freed() << " device pages, "
         << response.host_pages_freed() << " host pages\n";
  return kExitOk;
}

int RunPin(const PinOptions& o, const CommandContext& c) {
  const bool pin = o.ttl_ms > 0;
  if (o.node == 0) return Usage(c, "pin/unpin take a node id > 0");
  if (o.ttl_ms < 0 || o.ttl_ms > UINT32_MAX) {
    return Usage(c, "--ttl-ms takes 1..4294967295 milliseconds");
  }
  // Pins act in one namespace: the node's (--ns, default "").
  auto stub = Stub(c);
  TempSession session(stub.get(), c, o.ns);
  if (!session.status().ok()) {
    return RpcError(session.status(), c, session.leader());
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::PinRequest request;
  request.set_session_id(session.id());
  request.set_node(o.node);
  request.set_ttl_ms(static_cast<uint32_t>(o.ttl_ms));
  v1::PinResponse response;
  const grpc::Status status = stub->Pin(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, ctx, c);
  if (c.json) {
    PrintJson(ProtoToJson(response), c);
    return kExitOk;
  }
  *c.out << (pin ? absl::StrCat("pinned node ", o.node, " for ", o.ttl_ms,
                                " ms")
                 : absl::StrCat("unpinned node ", o.node))
         << "\n";
  return kExitOk;
}

int RunFreeRoom(const FreeRoomOptions& o, const CommandContext& c) {
  if ((o.l1.has_value() && *o.l1 < 0) || (o.l2.has_value() && *o.l2 < 0)) {
    return Usage(c, "free-room takes --l1 PAGES and --l2 PAGES (>= 0)");
  }
  auto stub = Stub(c);
  // The targets in force, or nullopt after printing why. Read through Stats
  // (a pure read): a daemon too old to report them leaves them unset.
  v1::SetFreeRoomResponse targets;
  if (!o.l1.has_value() || !o.l2.has_value()) {
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    v1::CacheStats stats;
    const grpc::Status status =
        stub->Stats(&ctx, v1::GetStatsRequest(), &stats);
    if (!status.ok()) return RpcError(status, ctx, c);
    if (!stats.free_room_reported()) {
      *c.err << "hicachectl: this hicached does not report its free-room "
                "targets (it is older than hicachectl); upgrade it, or set "
                "both with --l1 and --l2\n";
      return kExitFailure;
    }
    targets.set_l1_pages_per_lane(stats.l1_free_room_pages());
    targets.set_l2_pages_per_rank(stats.l2_free_room_pages());
  }
  if (o.l1.has_value() || o.l2.has_value()) {
    // An option not given keeps the value just read.
    v1::SetFreeRoomRequest request;
    request.set_l1_pages_per_lane(o.l1.value_or(targets.l1_pages_per_lane()));
    request.set_l2_pages_per_rank(o.l2.value_or(targets.l2_pages_per_rank()));
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    v1::SetFreeRoomResponse response;
    const grpc::Status status = stub->SetFreeRoom(&ctx, request, &response);
    if (!status.ok()) return RpcError(status, ctx, c);
    // What was set is what is in force (older daemons answer nothing).
    targets.set_l1_pages_per_lane(request.l1_pages_per_lane());
    targets.set_l2_pages_per_rank(request.l2_pages_per_rank());
  }
  if (c.json) {
    PrintJson(ProtoToJson(targets), c);
    return kExitOk;
  }
  *c.out << "free-room targets: L1 " << targets.l1_pages_per_lane()
         << " pages per lane, L2 " << targets.l2_pages_per_rank()
         << " pages per rank\n";
  return kExitOk;
}

int RunWatch(const WatchOptions& o, const CommandContext& c) {
  if (o.count == 0 || o.count < -1) {
    return Usage(c, "--count takes a positive number of events");
  }
  grpc::ClientContext ctx;
  if (o.duration.has_value()) {
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + *o.duration));
  }
  v1::WatchRequest request;
  request.set_include_layer_events(o.layers);
  auto stub = Stub(c);
  auto stream = stub->Watch(&ctx, request);
  v1::CacheEvent event;
  int64_t seen = 0;
  while ((o.count < 0 || seen < o.count) && stream->Read(&event)) {
    ++seen;
    if (c.json) {
      *c.out << JsonLine(ProtoToJson(event)) << std::endl;
      continue;
    }
    *c.out << absl::StrFormat("%d %s", event.unix_ms(), event.kind());
    if (event.op() != 0) *c.out << " op=" << event.op();
    if (event.node() != 0) *c.out << " node=" << event.node();
    if (!event.session_id().empty()) {
      *c.out << " session=" << event.session_id();
    }
    if (!event.detail().empty()) *c.out << " " << event.detail();
    *c.out << std::endl;
  }
  ctx.TryCancel();
  const grpc::Status status = stream->Finish();
  if (o.count > 0 && seen == o.count) return kExitOk;
  // The watch's time is up: a normal end (an unreachable daemon fails at
  // once with UNAVAILABLE instead: hicachectl does not wait for one).
  const bool time_up =
      o.duration.has_value() &&
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  return status.ok() || time_up ||
                 status.error_code() == grpc::StatusCode::CANCELLED
             ? kExitOk
             : RpcError(status, ctx, c);
}

std::string CompactOwners(const std::vector<uint32_t>& owners) {
  std::vector<std::string> runs;
  for (size_t i = 0; i < owners.size();) {
    size_t j = i;
    while (j < owners.size() && owners[j] == owners[i]) ++j;
    runs.push_back(j - i == 1 ? absl::StrCat(owners[i])
                              : absl::StrCat(owners[i], "x", j - i));
    i = j;
  }
  return runs.empty() ? "-" : absl::StrJoin(runs, ",");
}

}  // namespace hicache::ctl
