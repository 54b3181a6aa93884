#include "client/ctl/cli.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cpp/endpoint.h"
#include "client/ctl/cache_commands.h"
#include "client/ctl/quota_command.h"
#include "client/ctl/shm_command.h"
#include "client/ctl/connection.h"
#include "version/version.h"

namespace hicache::ctl {
namespace {

constexpr char kFooter[] =
    "Global options (--socket, --target, --json, --timeout, --tls_*, ...) go "
    "before or\nafter the command. With --json every command prints exactly "
    "one JSON document\n(watch: one JSON object per line), protobuf's "
    "canonical JSON: 64-bit integers\nare decimal strings. See "
    "docs/hicachectl.md.\n"
    "\n"
    "Exit codes:\n"
    "  0  success (for health: the daemon is SERVING)\n"
    "  1  the daemon is unreachable, returned an error, or is not serving\n"
    "  2  bad command line\n"
    "\n"
    "Examples:\n"
    "  hicachectl health\n"
    "  hicachectl --socket=/run/hicached/hicached.sock stats\n"
    "  hicachectl stats --json | python3 -m json.tool\n"
    "  hicachectl tree --sort hits --limit 5\n"
    "  hicachectl tree --all --json > tree.json\n"
    "  hicachectl match 1,2,3,4 --ns tenant-a\n"
    "  hicachectl tiers --file sequences.txt --json\n"
    "  hicachectl free-room                  # show the targets\n"
    "  hicachectl free-room --l1 64          # change L1, keep L2\n"
    "  hicachectl quota                      # pages against quotas\n"
    "  hicachectl quota --ns tenant-a --device-limit 2048\n"
    "  hicachectl watch --count 10 --json\n"
    "  hicachectl --target=node7:50051 --tls_ca_file=ca.pem health\n";

// "hicachectl 0.2.0 (1ac4859e1f2a)": the version and the git revision
// (//version; "unstamped" unless the binary links //version:stamped).
std::string VersionText() {
  return absl::StrCat("hicachectl ", hicache::VersionString());
}

// Values checked before conversion, with messages that say what is wanted
// (CLI11 prefixes the option's name).
CLI::Validator IntRange(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t value = 0;
        if (absl::SimpleAtoi(text, &value) && value >= lo && value <= hi) {
          return "";
        }
        if (hi == std::numeric_limits<int64_t>::max()) {
          return absl::StrCat("wants an integer >= ", lo, ", got '", text, "'");
        }
        return absl::StrCat("wants an integer in [", lo, ", ", hi, "], got '",
                            text, "'");
      },
      "");
}

// Seconds: more than 0, at most a day (deadlines further out overflow).
CLI::Validator TimeoutSeconds() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (absl::SimpleAtod(text, &value) && value > 0 && value <= 86400) {
          return "";
        }
        return absl::StrCat("wants a number of seconds in (0, 86400], got '",
                            text, "'");
      },
      "");
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

struct Globals {
  ConnectionOptions connection;
  bool json = false;
  double timeout_seconds = 5;
};

// Every command's options, bound to the parser.
struct Commands {
  HealthOptions health;
  TreeOptions tree;
  std::string tree_ns;
  uint64_t node = 0;
  MatchOptions match;
  TiersOptions tiers;
  EvictOptions evict;
  PinOptions pin;
  PinOptions unpin;
  int64_t l1 = 0, l2 = 0;
  std::string quota_ns;
  int64_t device_limit = 0, device_guaranteed = 0, host_limit = 0,
          host_guaranteed = 0;
  bool quota_clear = false;
  WatchOptions watch;
  ShmOptions shm;
  std::string help_topic;
};

// Options every command shares, so that they may follow it as well.
void AddGlobals(CLI::App& app, Globals& g) {
  app.add_option("--socket", g.connection.socket,
                 absl::StrCat("Daemon unix socket (default: $HICACHE_TARGET "
                              "or $HICACHE_SOCKET if set, else ",
                              client::kPackagedSocketPath,
                              " if it exists, else ",
                              client::DefaultSocketPath(), ")"))
      ->type_name("PATH");
  app.add_option("--target", g.connection.target,
                 "Any gRPC target (unix:/run/h.sock, host:port); overrides "
                 "--socket")
      ->type_name("ADDR");
  app.add_flag("--json", g.json, "Machine-readable output: one JSON document");
  app.add_option("--timeout", g.timeout_seconds,
                 "Per-call deadline in seconds (default 5)")
      ->type_name("SECONDS")
      ->check(TimeoutSeconds());
  app.add_flag("--insecure_tcp_for_testing", g.connection.insecure_tcp,
               "Allow a plain-TCP host:port target (tests only)");
  app.add_option("--tls_ca_file", g.connection.tls_ca_file,
                 "PEM CA that signed the daemon's TCP certificate (default: "
                 "the system roots)")
      ->type_name("FILE");
  app.add_option("--tls_cert_file", g.connection.tls_cert_file,
                 "PEM client certificate for mTLS (with --tls_key_file)")
      ->type_name("FILE");
  app.add_option("--tls_key_file", g.connection.tls_key_file,
                 "PEM private key of --tls_cert_file")
      ->type_name("FILE");
  app.add_option("--tls_server_name", g.connection.tls_server_name,
                 "Name the daemon's certificate must carry (default: the "
                 "target's host)")
      ->type_name("NAME");
}

CLI::App* AddCommand(CLI::App& app, const std::string& name,
                     const std::string& description) {
  CLI::App* sub = app.add_subcommand(name, description);
  // Options this command does not know fall through to the global ones.
  sub->fallthrough();
  sub->set_version_flag("--version", VersionText(),
                        "Print the version and git revision, then exit");
  return sub;
}

void AddCommands(CLI::App& app, Commands& c) {
  CLI::App* health = AddCommand(
      app, "health",
      "gRPC health of the daemon (or of SERVICE, e.g. hicache.v1.HiCache); "
      "prints SERVING when healthy");
  health->add_option("service", c.health.service, "Service name")
      ->type_name("SERVICE");

  AddCommand(app, "stats",
             "Build, backend, pool geometry and uptime, then the cache "
             "statistics");

  CLI::App* tree = AddCommand(
      app, "tree",
      "The radix tree, one page at a time: id, tokens, length, tier, locks, "
      "hits, pin, page owners per lane (0x3 = three pages of rank 0). The "
      "daemon sorts, then cuts the page");
  tree->add_option("--ns", c.tree_ns, "Only this namespace (default: all)")
      ->type_name("NS");
  tree->add_option("--prefix", c.tree.prefix,
                   "Only nodes under these tokens (1,2,3)")
      ->type_name("T,T,..");
  tree->add_option("--depth", c.tree.depth,
                   "Levels below the root (-1 or 0 = all)")
      ->type_name("N")
      ->check(IntRange(-1, 1 << 30));
  tree->add_option("--limit", c.tree.limit,
                   "Nodes per page (default: the daemon's, 1000; at most "
                   "10000)")
      ->type_name("N")
      ->check(IntRange(1, 10000));
  tree->add_option("--sort", c.tree.sort,
                   "tree (default: depth first), hits, recency, tokens, id")
      ->type_name("ORDER")
      ->check(
          CLI::IsMember({"tree", "hits", "recency", "tokens", "id", "len"}));
  tree->add_option("--page_token", c.tree.page_token,
                   "Continue where the previous page ended")
      ->type_name("TOKEN");
  tree->add_flag("--all", c.tree.all, "Follow the pages to the end");

  CLI::App* node =
      AddCommand(app, "node", "One node: every page's owner and host pages");
  node->add_option("id", c.node, "Node id")
      ->required()
      ->type_name("ID")
      ->check(IntRange(1, kInt64Max));

  CLI::App* match =
      AddCommand(app, "match",
                 "What a request would hit, per tier (a peek: no hit "
                 "is counted)");
  match->add_option("tokens", c.match.tokens, "Token ids: 1,2,3 or 1 2 3")
      ->type_name("T,T,..");
  match->add_option("--file", c.match.file, "Read the token ids from FILE")
      ->type_name("FILE");
  match->add_option("--ns", c.match.ns, "Namespace (default \"\")")
      ->type_name("NS");

  CLI::App* tiers = AddCommand(
      app, "tiers",
      "For routers: how much of each sequence each tier holds (QueryTiers, "
      "operators; a pure lookup: no hit counted, nothing locked)");
  tiers->add_option("tokens", c.tiers.tokens, "Token ids: 1,2,3 or 1 2 3")
      ->type_name("T,T,..");
  tiers->add_option("--file", c.tiers.file,
                    "One sequence of token ids per line (one batched call)")
      ->type_name("FILE");
  tiers->add_option("--ns", c.tiers.ns, "Namespace (default \"\")")
      ->type_name("NS");

  AddCommand(app, "cache-stats",
             "Tree, hit rates, backups, loads, evictions, pools per lane, "
             "sessions");
  AddCommand(app, "sessions", "Open sessions");

  CLI::App* evict = AddCommand(app, "evict",
                               "Evict pages per lane (device) / per rank "
                               "(host)");
  evict->add_option("--device", c.evict.device, "Pages per lane")
      ->type_name("N[,N..]")
      ->delimiter(',')
      ->check(IntRange(0, kInt64Max));
  evict->add_option("--host", c.evict.host, "Pages per rank")
      ->type_name("N[,N..]")
      ->delimiter(',')
      ->check(IntRange(0, kInt64Max));

  CLI::App* pin = AddCommand(app, "pin", "Protect a node's host copy");
  pin->add_option("id", c.pin.node, "Node id")
      ->required()
      ->type_name("ID")
      ->check(IntRange(1, kInt64Max));
  pin->add_option("--ttl-ms,--ttl_ms", c.pin.ttl_ms, "How long, in ms")
      ->required()
      ->type_name("MS")
      ->check(IntRange(1, UINT32_MAX));
  pin->add_option("--ns", c.pin.ns, "The node's namespace (default \"\")")
      ->type_name("NS");

  CLI::App* unpin = AddCommand(app, "unpin", "End a node's pin");
  unpin->add_option("id", c.unpin.node, "Node id")
      ->required()
      ->type_name("ID")
      ->check(IntRange(1, kInt64Max));
  unpin->add_option("--ns", c.unpin.ns, "The node's namespace (default \"\")")
      ->type_name("NS");

  CLI::App* free_room = AddCommand(
      app, "free-room",
      "Free-room targets kept after pressure. Without options: show them; "
      "an option not given keeps its value");
  free_room->add_option("--l1", c.l1, "Device pages kept free per lane")
      ->type_name("PAGES")
      ->check(IntRange(0, kInt64Max));
  free_room->add_option("--l2", c.l2, "Host pages kept free per rank")
      ->type_name("PAGES")
      ->check(IntRange(0, kInt64Max));

  CLI::App* quota = AddCommand(
      app, "quota",
      "Per-namespace page quotas. Without options: each namespace's pages "
      "against its quota; with --ns and page options: set them (options not "
      "given keep their values)");
  quota->add_option("--ns", c.quota_ns, "The namespace to set (\"\": default)")
      ->type_name("NS");
  quota->add_option("--device-limit", c.device_limit,
                    "Device pages it may hold, cached and requests (0: none)")
      ->type_name("PAGES")
      ->check(IntRange(0, kInt64Max));
  quota->add_option("--device-guaranteed", c.device_guaranteed,
                    "Device pages eviction for others leaves it")
      ->type_name("PAGES")
      ->check(IntRange(0, kInt64Max));
  quota->add_option("--host-limit", c.host_limit,
                    "Host pages it may hold (0: none)")
      ->type_name("PAGES")
      ->check(IntRange(0, kInt64Max));
  quota->add_option("--host-guaranteed", c.host_guaranteed,
                    "Host pages eviction for others leaves it")
      ->type_name("PAGES")
      ->check(IntRange(0, kInt64Max));
  quota->add_flag("--clear", c.quota_clear, "Remove the namespace's quota");

  CLI::App* watch =
      AddCommand(app, "watch",
                 "Live cache events (with --json: one JSON object per line), "
                 "until --count events, --timeout seconds or an interrupt");
  watch->add_flag("--layers", c.watch.layers, "Also every per-layer step");
  watch->add_option("--count", c.watch.count, "Stop after N events")
      ->type_name("N")
      ->check(IntRange(1, kInt64Max));

  CLI::App* shm = AddCommand(
      app, "shm",
      "This machine's hicached shared memory, no daemon needed: 'list' "
      "(instances, live or not, and their segments), 'clean' (remove what "
      "instances no daemon holds left: their pools and kept host tiers)");
  shm->require_subcommand(1, 1);
  CLI::App* shm_list = shm->add_subcommand("list", "Instances and segments");
  shm_list->fallthrough();
  CLI::App* shm_clean = shm->add_subcommand(
      "clean", "Remove the segments of every instance that is not live");
  shm_clean->fallthrough();
  shm_clean->add_option("--instance", c.shm.instance, "Only this instance")
      ->type_name("ID");
  shm_clean->add_flag("--dry_run", c.shm.dry_run,
                      "Say what would be removed, remove nothing");
  shm->add_option("--shm_dir", c.shm.dir,
                  "Where the segments are (default /dev/shm)")
      ->type_name("DIR");

  CLI::App* help = app.add_subcommand("help", "This text, or a command's");
  help->add_option("command", c.help_topic, "Command")->type_name("COMMAND");
}

// The parser for one invocation; `globals` and `commands` receive the values.
std::unique_ptr<CLI::App> BuildApp(Globals& globals, Commands& commands) {
  auto app = std::make_unique<CLI::App>(
      "hicachectl: inspect and operate a hicached KV-cache daemon.",
      "hicachectl");
  app->require_subcommand(0, 1);
  // A repeated option takes its last value (a wrapper's default, then the
  // user's), as hicached's flags do. Commands inherit this.
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->set_version_flag("--version", VersionText(),
                        "Print the version and git revision, then exit");
  app->footer(kFooter);
  app->get_formatter()->column_width(34);
  AddGlobals(*app, globals);
  AddCommands(*app, commands);
  return app;
}

int Dispatch(CLI::App& app, const Globals& g, Commands& cmds, std::ostream& out,
             std::ostream& err) {
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  if (chosen.empty()) {
    err << "hicachectl: missing command; run 'hicachectl --help'\n";
    return kExitUsage;
  }
  const std::string name = chosen.front()->get_name();
  if (name == "help") {
    if (cmds.help_topic.empty()) {
      out << app.help();
      return kExitOk;
    }
    for (CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == cmds.help_topic) {
        out << sub->help();
        return kExitOk;
      }
    }
    err << "hicachectl: help: unknown command '" << cmds.help_topic
        << "'; run 'hicachectl --help'\n";
    return kExitUsage;
  }
  if (name == "shm") {  // Local: no daemon.
    CommandContext local;
    local.json = g.json;
    local.out = &out;
    local.err = &err;
    const CLI::App* verb = chosen.front()->get_subcommands().front();
    return verb->get_name() == "list" ? RunShmList(cmds.shm, local)
                                      : RunShmClean(cmds.shm, local);
  }
  absl::StatusOr<Connection> connection = Connect(g.connection);
  if (!connection.ok()) {
    err << "hicachectl: " << connection.status().message() << "\n";
    return kExitUsage;
  }
  CommandContext c;
  c.channel = connection->channel;
  c.target = connection->target;
  c.socket_path = connection->socket_path;
  c.json = g.json;
  c.timeout = absl::Seconds(g.timeout_seconds);
  c.out = &out;
  c.err = &err;
  if (name == "health") return RunHealth(cmds.health, c);
  if (name == "stats") return RunStats(c);
  if (name == "tree") {
    if (chosen.front()->count("--ns") > 0) cmds.tree.ns = cmds.tree_ns;
    return RunTree(cmds.tree, c);
  }
  if (name == "node") return RunNode(cmds.node, c);
  if (name == "match") return RunMatch(cmds.match, c);
  if (name == "tiers") return RunTiers(cmds.tiers, c);
  if (name == "cache-stats") return RunCacheStats(c);
  if (name == "sessions") return RunSessions(c);
  if (name == "evict") return RunEvict(cmds.evict, c);
  if (name == "pin") return RunPin(cmds.pin, c);
  if (name == "unpin") {
    cmds.unpin.ttl_ms = 0;
    return RunPin(cmds.unpin, c);
  }
  if (name == "free-room") {
    FreeRoomOptions options;
    if (chosen.front()->count("--l1") > 0) options.l1 = cmds.l1;
    if (chosen.front()->count("--l2") > 0) options.l2 = cmds.l2;
    return RunFreeRoom(options, c);
  }
  if (name == "quota") {
    const CLI::App& q = *chosen.front();
    QuotaOptions options;
    if (q.count("--ns") > 0) options.ns = cmds.quota_ns;
    if (q.count("--device-limit") > 0) options.device_limit = cmds.device_limit;
    if (q.count("--device-guaranteed") > 0) {
      options.device_guaranteed = cmds.device_guaranteed;
    }
    if (q.count("--host-limit") > 0) options.host_limit = cmds.host_limit;
    if (q.count("--host-guaranteed") > 0) {
      options.host_guaranteed = cmds.host_guaranteed;
    }
    options.clear = cmds.quota_clear;
    return RunQuota(options, c);
  }
  if (name == "watch") {
    // A given --timeout ends the watch (by default it runs until --count
    // events or an interrupt): it once blocked for good.
    if (app.count("--timeout") > 0) cmds.watch.duration = c.timeout;
    return RunWatch(cmds.watch, c);
  }
  err << "hicachectl: unknown command '" << name << "'\n";
  return kExitUsage;
}

// A parse error as one or two lines: what was wrong, then where to look.
int ReportParseError(const CLI::App& app, const CLI::ParseError& e,
                     const std::vector<std::string>& args, std::ostream& err) {
  const std::vector<CLI::App*> chosen = app.get_subcommands();
  std::string what = e.what();
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::ExtrasError)) {
    // "The following argument(s) were not expected: b a" (CLI11 lists them
    // last first, as it parses argv reversed): name the one the user wrote
    // first ('completion bash' was "unknown command 'bash'"); before any
    // command, a stray word was meant as a command.
    const size_t colon = what.find(": ");
    std::string first;
    size_t first_at = args.size();
    if (colon != std::string::npos) {
      for (absl::string_view word :
           absl::StrSplit(absl::string_view(what).substr(colon + 2), ' ',
                          absl::SkipEmpty())) {
        const auto at = std::find(args.begin(), args.end(), word);
        if (first.empty() || static_cast<size_t>(at - args.begin()) < first_at) {
          first = std::string(word);
          first_at = static_cast<size_t>(at - args.begin());
        }
      }
    }
    if (!first.empty() && first[0] == '-') {
      what = absl::StrCat("unknown option '", first, "'");
    } else if (!first.empty() && chosen.empty()) {
      what = absl::StrCat("unknown command '", first, "'");
    } else if (!first.empty()) {
      what = absl::StrCat("unexpected argument '", first, "' for ",
                          chosen.front()->get_name());
    }
  }
  err << "hicachectl: " << what << "\n"
      << "hicachectl: run 'hicachectl "
      << (chosen.empty() ? "" : chosen.front()->get_name() + " ")
      << "--help' for the options\n";
  return kExitUsage;
}

}  // namespace

std::string UsageText() {
  Globals globals;
  Commands commands;
  return BuildApp(globals, commands)->help();
}

int RunCli(const std::vector<std::string>& args, std::ostream& out,
           std::ostream& err) {
  Globals globals;
  Commands commands;
  std::unique_ptr<CLI::App> app;
  try {
    app = BuildApp(globals, commands);
  } catch (const std::exception& e) {  // A bug in the option table.
    err << "hicachectl: internal error: " << e.what() << "\n";
    return kExitFailure;
  }
  // CLI11 wants argv order reversed in a vector.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app->parse(reversed);
  } catch (const CLI::Success& e) {  // --help, --version.
    app->exit(e, out, err);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    return ReportParseError(*app, e, args, err);
  }
  try {
    return Dispatch(*app, globals, commands, out, err);
  } catch (const std::exception& e) {  // Never let one escape main().
    err << "hicachectl: internal error: " << e.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace hicache::ctl
