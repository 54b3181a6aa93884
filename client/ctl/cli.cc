#include "client/ctl/cli.h"

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"
#include "client/ctl/cache_commands.h"
#include "client/ctl/output_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace hicache::ctl {
namespace {

struct Options {
  std::string socket;  // --socket; empty = default path.
  std::string target;  // --target; overrides --socket.
  bool json = false;
  bool insecure_tcp = false;
  absl::Duration timeout = absl::Seconds(5);
  std::string command;
  std::vector<std::string> command_args;
};

// Parses the command line. Returns nullopt after writing a message to `err`.
std::optional<Options> ParseArgs(const std::vector<std::string>& args,
                                 std::ostream& err, bool* help) {
  Options options;
  *help = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!options.command.empty()) {
      options.command_args.push_back(arg);
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "help") {
      *help = true;
      return options;
    }
    if (!absl::StartsWith(arg, "-")) {
      options.command = arg;
      continue;
    }
    std::string name = arg;
    std::optional<std::string> value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (name == "--json") {
      options.json = true;
      continue;
    }
    if (name == "--insecure_tcp_for_testing") {
      options.insecure_tcp = true;
      continue;
    }
    if (name != "--socket" && name != "--target" && name != "--timeout") {
      err << "hicachectl: unknown option '" << name
          << "'; run 'hicachectl --help' for the list\n";
      return std::nullopt;
    }
    if (!value.has_value()) {
      if (i + 1 >= args.size()) {
        err << "hicachectl: option '" << name << "' needs a value\n";
        return std::nullopt;
      }
      value = args[++i];
    }
    if (name == "--socket") {
      options.socket = *value;
    } else if (name == "--target") {
      options.target = *value;
    } else {
      double seconds = 0;
      if (!absl::SimpleAtod(*value, &seconds) || !(seconds > 0)) {
        err << "hicachectl: --timeout must be a positive number of seconds, "
               "got '"
            << *value << "'\n";
        return std::nullopt;
      }
      options.timeout = absl::Seconds(seconds);
    }
  }
  if (options.command.empty()) {
    err << "hicachectl: missing command; run 'hicachectl --help'\n";
    return std::nullopt;
  }
  return options;
}

std::string ResolveTarget(const Options& options) {
  if (!options.target.empty()) return options.target;
  return client::UnixTarget(options.socket.empty() ? client::DefaultSocketPath()
                                                   : options.socket);
}

int ReportRpcError(const absl::Status& status, const std::string& target,
                   std::ostream& err) {
  err << "hicachectl: " << status.message() << "\n";
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    err << "hicachectl: is hicached running at " << target
        << "? Start it with 'tools/dev run', or point at it with --socket "
           "or --target.\n";
  }
  return kExitFailure;
}

int RunHealth(client::HiCacheClient& client, const Options& options,
              const std::string& target, std::ostream& out, std::ostream& err) {
  const std::string service =
      options.command_args.empty() ? "" : options.command_args[0];
  absl::StatusOr<client::ServingStatus> health =
      client.CheckHealth(service, options.timeout);
  if (!health.ok()) return ReportRpcError(health.status(), target, err);
  const char* name = client::ServingStatusName(*health);
  if (options.json) {
    out << "{\"status\":\"" << name << "\",\"service\":\"" << service
        << "\",\"target\":\"" << target << "\"}\n";
  } else {
    out << name << "\n";
  }
  return *health == client::ServingStatus::kServing ? kExitOk : kExitFailure;
}

int RunStats(client::HiCacheClient& client, const Options& options,
             const std::string& target, std::ostream& out, std::ostream& err) {
  absl::StatusOr<v1::GetStatsResponse> stats = client.GetStats(options.timeout);
  if (!stats.ok()) return ReportRpcError(stats.status(), target, err);
  if (!options.json) {
    out << FormatStatsHuman(*stats) << "\n";
  } else {
    absl::StatusOr<std::string> json = ToJson(*stats);
    if (!json.ok()) {
      err << "hicachectl: " << json.status().message() << "\n";
      return kExitFailure;
    }
    out << *json << "\n";
  }
  // Then the cache: pools per lane, hit rates, backups, loads, evictions.
  auto stub = v1::HiCache::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  CommandContext context{stub.get(),      target, options.json,
                         options.timeout, &out,   &err};
  return RunCacheCommand("cache-stats", {}, context);
}

}  // namespace

std::string UsageText() {
  return absl::StrCat(
      "hicachectl: inspect and operate a hicached KV-cache daemon.\n"
      "\n"
      "Usage: hicachectl [options] <command> [args]\n"
      "\n"
      "Commands:\n"
      "  health [SERVICE]   gRPC health of the daemon (or of SERVICE, e.g.\n"
      "                     hicache.v1.HiCache). Prints SERVING when healthy.\n"
      "  stats              Build, backend, pool geometry and uptime, then "
      "the\n"
      "                     cache statistics (with --json: two JSON "
      "objects).\n",
      CacheCommandsUsage(),
      "\n"
      "Options:\n"
      "  --socket=PATH      Daemon unix socket (default: ",
      client::DefaultSocketPath(),
      ",\n"
      "                     i.e. $XDG_RUNTIME_DIR/hicached.sock or "
      "/tmp/hicached.sock).\n"
      "  --target=ADDR      Any gRPC target, e.g. unix:/run/h.sock; overrides "
      "--socket.\n"
      "  --json             Machine-readable output (one JSON object).\n"
      "  --timeout=SECONDS  Per-call deadline (default 5).\n"
      "  --insecure_tcp_for_testing  Allow a plain-TCP host:port target.\n"
      "  -h, --help         This text.\n"
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
      "  hicachectl tree --depth 2 --sort hits\n"
      "  hicachectl match 1,2,3,4 --ns tenant-a\n"
      "  hicachectl watch --count 10\n");
}

int RunCli(const std::vector<std::string>& args, std::ostream& out,
           std::ostream& err) {
  bool help = false;
  std::optional<Options> options = ParseArgs(args, err, &help);
  if (help) {
    out << UsageText();
    return kExitOk;
  }
  if (!options.has_value()) return kExitUsage;

  const std::string target = ResolveTarget(*options);
  absl::StatusOr<std::unique_ptr<client::HiCacheClient>> client =
      client::HiCacheClient::Create(target, options->insecure_tcp);
  if (!client.ok()) {
    err << "hicachectl: " << client.status().message() << "\n";
    return kExitUsage;
  }
  if (options->command == "health") {
    if (options->command_args.size() > 1) {
      err << "hicachectl: health takes at most one argument (a service name)\n";
      return kExitUsage;
    }
    return RunHealth(**client, *options, target, out, err);
  }
  if (options->command == "stats") {
    if (!options->command_args.empty()) {
      err << "hicachectl: stats takes no arguments\n";
      return kExitUsage;
    }
    return RunStats(**client, *options, target, out, err);
  }
  if (IsCacheCommand(options->command)) {
    auto stub = v1::HiCache::NewStub(
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    CommandContext context{stub.get(),       target, options->json,
                           options->timeout, &out,   &err};
    return RunCacheCommand(options->command, options->command_args, context);
  }
  err << "hicachectl: unknown command '" << options->command
      << "'; run 'hicachectl --help' for the list\n";
  return kExitUsage;
}

}  // namespace hicache::ctl
