#include "client/ctl/cache_commands.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/ctl/cli.h"
#include "client/ctl/output_format.h"
#include "grpcpp/client_context.h"

namespace hicache::ctl {
namespace {

// --key=value / --key value options and positional arguments of a command.
struct Args {
  std::map<std::string, std::string> options;
  std::vector<std::string> positional;
  bool Has(const std::string& key) const { return options.count(key) > 0; }
  std::string Get(const std::string& key,
                  const std::string& fallback = "") const {
    auto it = options.find(key);
    return it == options.end() ? fallback : it->second;
  }
};

// Flags that take no value.
bool IsSwitch(const std::string& name) { return name == "--layers"; }

std::optional<Args> Parse(const std::vector<std::string>& raw,
                          std::ostream& err) {
  Args args;
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string& a = raw[i];
    if (a.rfind("--", 0) != 0) {
      args.positional.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    if (eq != std::string::npos) {
      args.options[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (IsSwitch(a)) {
      args.options[a] = "1";
    } else if (i + 1 < raw.size()) {
      args.options[a] = raw[++i];
    } else {
      err << "hicachectl: option '" << a << "' needs a value\n";
      return std::nullopt;
    }
  }
  return args;
}

bool ParseInt(const std::string& text, int64_t* value) {
  return absl::SimpleAtoi(text, value);
}

// "1,2,3" or "1 2 3".
std::optional<std::vector<int32_t>> ParseTokens(const std::string& text) {
  std::vector<int32_t> tokens;
  for (absl::string_view part :
       absl::StrSplit(text, absl::ByAnyChar(", \n\t"), absl::SkipEmpty())) {
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

void Deadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(timeout));
}

int RpcError(const grpc::Status& status, const CommandContext& c) {
  *c.err << "hicachectl: " << status.error_message() << " (code "
         << status.error_code() << ")\n";
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    *c.err
        << "hicachectl: is hicached running at " << c.target
        << "? Start it with 'tools/dev run', or point at it with --socket or "
           "--target.\n";
  }
  return kExitFailure;
}

int Usage(const CommandContext& c, const std::string& message) {
  *c.err << "hicachectl: " << message << "; run 'hicachectl --help'\n";
  return kExitUsage;
}

int PrintJson(const google::protobuf::Message& message,
              const CommandContext& c) {
  auto json = ToJson(message);
  if (!json.ok()) {
    *c.err << "hicachectl: " << json.status().message() << "\n";
    return kExitFailure;
  }
  *c.out << *json << "\n";
  return kExitOk;
}

std::string Tokens(const google::protobuf::RepeatedField<int32_t>& tokens) {
  return absl::StrJoin(tokens, ",");
}

// A short-lived scheduler session for commands that need one.
class TempSession {
 public:
  TempSession(const CommandContext& c, const std::string& ns) : c_(c) {
    grpc::ClientContext ctx;
    Deadline(&ctx, c.timeout);
    v1::OpenSessionRequest request;
    request.set_client_name("hicachectl");
    request.set_role(v1::ROLE_SCHEDULER);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    status_ = c.stub->OpenSession(&ctx, request, &response);
    id_ = response.session_id();
  }
  ~TempSession() {
    if (!status_.ok()) return;
    grpc::ClientContext ctx;
    Deadline(&ctx, c_.timeout);
    v1::CloseSessionRequest request;
    request.set_session_id(id_);
    v1::CloseSessionResponse response;
    c_.stub->CloseSession(&ctx, request, &response);
  }
  const grpc::Status& status() const { return status_; }
  const std::string& id() const { return id_; }

 private:
  const CommandContext& c_;
  grpc::Status status_;
  std::string id_;
};

int Tree(const Args& a, const CommandContext& c) {
  v1::DumpTreeRequest request;
  request.set_namespace_(a.Get("--ns"));
  request.set_all_namespaces(!a.Has("--ns"));
  int64_t depth = -1, limit = 0;
  if ((a.Has("--depth") && !ParseInt(a.Get("--depth"), &depth)) ||
      (a.Has("--limit") && !ParseInt(a.Get("--limit"), &limit))) {
    return Usage(c, "--depth and --limit take integers");
  }
  request.set_max_depth(static_cast<int32_t>(depth));
  request.set_limit(limit);
  if (a.Has("--prefix")) {
    auto prefix = ParseTokens(a.Get("--prefix"));
    if (!prefix.has_value())
      return Usage(c, "--prefix takes token ids like 1,2,3");
    request.set_prefix(Pack(*prefix));
  }
  const std::string sort = a.Get("--sort", "tree");
  if (sort != "tree" && sort != "hits" && sort != "len" && sort != "id") {
    return Usage(c, "--sort is one of tree, hits, len, id");
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::DumpTreeResponse response;
  grpc::Status status = c.stub->DumpTree(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, c);
  std::vector<v1::NodeInfo> nodes(response.nodes().begin(),
                                  response.nodes().end());
  if (sort != "tree") {
    std::stable_sort(nodes.begin(), nodes.end(),
                     [&](const v1::NodeInfo& x, const v1::NodeInfo& y) {
                       if (sort == "hits") return x.hits() > y.hits();
                       if (sort == "len") return x.length() > y.length();
                       return x.id() < y.id();
                     });
  }
  if (c.json) {
    v1::DumpTreeResponse sorted;
    for (const auto& n : nodes) *sorted.add_nodes() = n;
    return PrintJson(sorted, c);
  }
  if (nodes.empty()) *c.out << "(empty)\n";
  for (const v1::NodeInfo& n : nodes) {
    std::vector<uint32_t> owners(n.page_owners().begin(),
                                 n.page_owners().end());
    *c.out << std::string(sort == "tree" ? 2 * (n.depth() - 1) : 0, ' ')
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
                  n.namespace_().empty()
                      ? ""
                      : absl::StrCat(" ns=", n.namespace_()));
  }
  return kExitOk;
}

int Node(const Args& a, const CommandContext& c) {
  int64_t id = 0;
  if (a.positional.size() != 1 || !ParseInt(a.positional[0], &id) || id <= 0) {
    return Usage(c, "node takes one node id");
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::InspectNodeRequest request;
  request.set_node(id);
  v1::NodeInfo n;
  grpc::Status status = c.stub->InspectNode(&ctx, request, &n);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(n, c);
  *c.out << absl::StrFormat(
      "node %d (parent %d, namespace '%s', depth %d)\ntokens   %d..%d (%d)\n"
      "tier     %s%s\nlock     %d, host_ref %d, hits %d, priority %d, pin "
      "%dms\n",
      n.id(), n.parent(), n.namespace_(), n.depth(), n.start(),
      n.start() + n.length(), n.length(), n.tier(),
      n.pending_backup() ? " (backup in flight)" : "", n.lock_ref(),
      n.host_ref(), n.hits(), n.priority(), n.pin_remaining_ms());
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

int Match(const Args& a, const CommandContext& c) {
  std::string text;
  if (a.Has("--file")) {
    std::ifstream in(a.Get("--file"));
    if (!in) return Usage(c, "cannot read " + a.Get("--file"));
    std::stringstream buffer;
    buffer << in.rdbuf();
    text = buffer.str();
  } else {
    text = absl::StrJoin(a.positional, ",");
  }
  auto tokens = ParseTokens(text);
  if (!tokens.has_value() || tokens->empty()) {
    return Usage(c, "match takes token ids (1,2,3) or --file F");
  }
  TempSession session(c, a.Get("--ns"));
  if (!session.status().ok()) return RpcError(session.status(), c);
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::MatchPrefixRequest request;
  request.set_session_id(session.id());
  request.set_peek(true);  // Inspection: counts no hit, starts no backup.
  request.add_items()->set_tokens(Pack(*tokens));
  v1::MatchPrefixResponse response;
  grpc::Status status = c.stub->MatchPrefix(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(response, c);
  const v1::MatchResult& r = response.results(0);
  *c.out << absl::StrFormat(
      "query     %d tokens\ndevice    %d tokens in %d pages (node %d)\n"
      "host      %d more tokens (node %d)\nmiss      %d tokens\n",
      tokens->size(), r.device().valid_tokens(), r.device().pages_size(),
      r.last_device_node(), r.host_hit_tokens(), r.last_host_node(),
      tokens->size() - r.device().valid_tokens() - r.host_hit_tokens());
  return kExitOk;
}

int CacheStatsCommand(const CommandContext& c) {
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::CacheStats s;
  grpc::Status status = c.stub->Stats(&ctx, v1::GetStatsRequest(), &s);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(s, c);
  auto pct = [](int64_t part, int64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * part / whole;
  };
  *c.out << absl::StrFormat(
      "tree       %d nodes; device %d tokens (%d locked, %d evictable); host "
      "%d "
      "tokens; %d backups in flight\n"
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
  *c.out << "lane  device free  release  used   host free  used\n";
  for (const v1::LaneStats& l : s.lanes()) {
    *c.out << absl::StrFormat("%-5d %11d  %7d  %5d   %9d  %4d\n", l.lane(),
                              l.free(), l.release(), l.allocated(),
                              l.host_free(), l.host_used());
  }
  return kExitOk;
}

int Sessions(const CommandContext& c) {
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::ListSessionsResponse response;
  grpc::Status status =
      c.stub->ListSessions(&ctx, v1::ListSessionsRequest(), &response);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(response, c);
  if (response.sessions().empty()) *c.out << "(no sessions)\n";
  for (const v1::SessionSummary& s : response.sessions()) {
    *c.out << absl::StrFormat(
        "%s  %-20s %-9s rank %d  ns '%s'  lease %dms\n", s.session_id(),
        s.client_name(), s.role() == v1::ROLE_WORKER ? "worker" : "scheduler",
        s.rank(), s.namespace_(), s.lease_ms());
  }
  return kExitOk;
}

int Evict(const Args& a, const CommandContext& c) {
  v1::EvictRequest request;
  for (const auto& [flag, field] :
       {std::pair{"--device", request.mutable_device_pages_per_lane()},
        std::pair{"--host", request.mutable_host_pages_per_rank()}}) {
    if (!a.Has(flag)) continue;
    for (absl::string_view part : absl::StrSplit(a.Get(flag), ',')) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(part, &n) || n < 0) {
        return Usage(
            c, absl::StrCat(flag, " takes page counts per lane, e.g. 8,8"));
      }
      field->Add(n);
    }
  }
  if (request.device_pages_per_lane().empty() &&
      request.host_pages_per_rank().empty()) {
    return Usage(c, "evict needs --device N[,N...] and/or --host N[,N...]");
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::EvictResponse response;
  grpc::Status status = c.stub->Evict(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(response, c);
  *c.out << "evicted " << response.device_pages_freed() << " device pages, "
         << response.host_pages_freed() << " host pages\n";
  return kExitOk;
}

int Pin(const Args& a, const CommandContext& c, bool pin) {
  int64_t node = 0, ttl = 0;
  if (a.positional.size() != 1 || !ParseInt(a.positional[0], &node) ||
      node <= 0) {
    return Usage(
        c, pin ? "pin takes a node id and --ttl-ms" : "unpin takes a node id");
  }
  if (pin && (!ParseInt(a.Get("--ttl-ms"), &ttl) || ttl <= 0)) {
    return Usage(c,
                 "pin needs --ttl-ms with a positive number of milliseconds");
  }
  // Pins act in one namespace: the node's (--ns, default "").
  TempSession session(c, a.Get("--ns"));
  if (!session.status().ok()) return RpcError(session.status(), c);
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::PinRequest request;
  request.set_session_id(session.id());
  request.set_node(node);
  request.set_ttl_ms(static_cast<uint32_t>(pin ? ttl : 0));
  v1::PinResponse response;
  grpc::Status status = c.stub->Pin(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(response, c);
  *c.out << (pin ? absl::StrCat("pinned node ", node, " for ", ttl, " ms")
                 : absl::StrCat("unpinned node ", node))
         << "\n";
  return kExitOk;
}

int FreeRoom(const Args& a, const CommandContext& c) {
  int64_t l1 = 0, l2 = 0;
  if (!ParseInt(a.Get("--l1", "0"), &l1) ||
      !ParseInt(a.Get("--l2", "0"), &l2) || l1 < 0 || l2 < 0) {
    return Usage(c, "free-room takes --l1 PAGES and --l2 PAGES (>= 0)");
  }
  grpc::ClientContext ctx;
  Deadline(&ctx, c.timeout);
  v1::SetFreeRoomRequest request;
  request.set_l1_pages_per_lane(l1);
  request.set_l2_pages_per_rank(l2);
  v1::SetFreeRoomResponse response;
  grpc::Status status = c.stub->SetFreeRoom(&ctx, request, &response);
  if (!status.ok()) return RpcError(status, c);
  if (c.json) return PrintJson(response, c);
  *c.out << "free-room targets: L1 " << l1 << " pages per lane, L2 " << l2
         << " pages per rank\n";
  return kExitOk;
}

int Watch(const Args& a, const CommandContext& c) {
  int64_t count = -1;
  if (a.Has("--count") && (!ParseInt(a.Get("--count"), &count) || count <= 0)) {
    return Usage(c, "--count takes a positive number of events");
  }
  grpc::ClientContext ctx;
  v1::WatchRequest request;
  request.set_include_layer_events(a.Has("--layers"));
  auto stream = c.stub->Watch(&ctx, request);
  v1::CacheEvent event;
  int64_t seen = 0;
  while ((count < 0 || seen < count) && stream->Read(&event)) {
    ++seen;
    if (c.json) {
      PrintJson(event, c);
      continue;
    }
    *c.out << absl::StrFormat("%d %s", event.unix_ms(), event.kind());
    if (event.op() != 0) *c.out << " op=" << event.op();
    if (event.node() != 0) *c.out << " node=" << event.node();
    if (!event.session_id().empty())
      *c.out << " session=" << event.session_id();
    if (!event.detail().empty()) *c.out << " " << event.detail();
    *c.out << std::endl;
  }
  ctx.TryCancel();
  grpc::Status status = stream->Finish();
  if (count > 0 && seen == count) return kExitOk;
  return status.ok() || status.error_code() == grpc::StatusCode::CANCELLED
             ? kExitOk
             : RpcError(status, c);
}

}  // namespace

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

bool IsCacheCommand(const std::string& command) {
  for (const char* name : {"tree", "node", "match", "cache-stats", "sessions",
                           "evict", "pin", "unpin", "free-room", "watch"}) {
    if (command == name) return true;
  }
  return false;
}

int RunCacheCommand(const std::string& command,
                    const std::vector<std::string>& raw,
                    const CommandContext& c) {
  std::optional<Args> args = Parse(raw, *c.err);
  if (!args.has_value()) return kExitUsage;
  if (command == "tree") return Tree(*args, c);
  if (command == "node") return Node(*args, c);
  if (command == "match") return Match(*args, c);
  if (command == "cache-stats") return CacheStatsCommand(c);
  if (command == "sessions") return Sessions(c);
  if (command == "evict") return Evict(*args, c);
  if (command == "pin") return Pin(*args, c, true);
  if (command == "unpin") return Pin(*args, c, false);
  if (command == "free-room") return FreeRoom(*args, c);
  if (command == "watch") return Watch(*args, c);
  return Usage(c, "unknown command '" + command + "'");
}

std::string CacheCommandsUsage() {
  return "  tree [--ns NS] [--prefix T,T,..] [--depth N] [--limit N]\n"
         "       [--sort tree|hits|len|id]\n"
         "                     The radix tree: id, tokens, length, tier, "
         "locks,\n"
         "                     hits, pin, page owners per lane (0x3 = three "
         "pages\n"
         "                     of rank 0).\n"
         "  node ID            One node: every page's owner and host pages.\n"
         "  match T,T,..|--file F [--ns NS]\n"
         "                     What a request would hit, per tier.\n"
         "  cache-stats        Tree, hit rates, backups, loads, evictions, "
         "pools\n"
         "                     per lane, sessions.\n"
         "  sessions           Open sessions.\n"
         "  evict --device N[,N..] [--host N[,N..]]\n"
         "                     Evict pages per lane / per rank.\n"
         "  pin ID --ttl-ms MS [--ns NS] | unpin ID [--ns NS]\n"
         "                     Protect a node's host copy.\n"
         "  free-room --l1 PAGES --l2 PAGES\n"
         "                     Free-room targets after pressure.\n"
         "  watch [--layers] [--count N]\n"
         "                     Live cache events.\n";
}

}  // namespace hicache::ctl
