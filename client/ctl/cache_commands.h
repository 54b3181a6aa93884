#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::ctl {

// What every command gets: where the daemon is and where output goes.
struct CommandContext {
  std::shared_ptr<grpc::Channel> channel;
  std::string target;       // For messages.
  std::string socket_path;  // "" for TCP targets.
  bool json = false;        // Print exactly one JSON document.
  absl::Duration timeout = absl::Seconds(5);
  std::ostream* out;
  std::ostream* err;
};

// The commands' own options, as the command line parsed them. Each Run*
// returns the exit code (0 ok, 1 daemon error or unreachable, 2 bad value
// found only now, e.g. a token list).

struct HealthOptions {
  std::string service;  // "" = the whole daemon.
};
int RunHealth(const HealthOptions& options, const CommandContext& c);

// Daemon identity, then the cache statistics.
int RunStats(const CommandContext& c);

struct TreeOptions {
  std::optional<std::string> ns;  // Unset = every namespace.
  std::string prefix;             // "1,2,3"; "" = none.
  int depth = -1;                 // -1 = unlimited.
  int64_t limit = 0;              // Nodes per page; 0 = the daemon's default.
  std::string sort = "tree";      // tree|hits|recency|tokens|id (len=tokens).
  std::string page_token;         // Continue a previous listing.
  bool all = false;               // Follow the tokens to the end.
};
int RunTree(const TreeOptions& options, const CommandContext& c);

int RunNode(uint64_t node, const CommandContext& c);

struct MatchOptions {
  std::vector<std::string> tokens;  // "1,2,3" or "1 2 3" pieces.
  std::string file;                 // Or a file of token ids.
  std::string ns;
};
int RunMatch(const MatchOptions& options, const CommandContext& c);

// QueryTiers (operators): per sequence, the tokens on device and the tokens
// past them on the host tier. Token ids as for match, or --file with one
// sequence per line (one batched call).
struct TiersOptions {
  std::vector<std::string> tokens;
  std::string file;
  std::string ns;
};
int RunTiers(const TiersOptions& options, const CommandContext& c);

int RunCacheStats(const CommandContext& c);
int RunSessions(const CommandContext& c);

struct EvictOptions {
  std::vector<int64_t> device;  // Pages per lane.
  std::vector<int64_t> host;    // Pages per rank.
};
int RunEvict(const EvictOptions& options, const CommandContext& c);

struct PinOptions {
  uint64_t node = 0;
  int64_t ttl_ms = 0;  // 0 = unpin.
  std::string ns;
};
int RunPin(const PinOptions& options, const CommandContext& c);

// Unset targets keep their current values; with neither set, the command
// only reads and prints them.
struct FreeRoomOptions {
  std::optional<int64_t> l1;  // Pages per lane.
  std::optional<int64_t> l2;  // Pages per rank.
};
int RunFreeRoom(const FreeRoomOptions& options, const CommandContext& c);

struct WatchOptions {
  bool layers = false;
  int64_t count = -1;  // -1 = until interrupted.
  // Set: the watch ends after this long (exit 0), events or not.
  std::optional<absl::Duration> duration;
};
// With --json, one JSON object per line (one document per event).
int RunWatch(const WatchOptions& options, const CommandContext& c);

// "0x3,1x2,0": run-length form of a page-owner list.
std::string CompactOwners(const std::vector<uint32_t>& owners);

// Maps a --sort word to the RPC's order; nullopt for an unknown word.
std::optional<v1::TreeSort> ParseTreeSort(const std::string& word);

}  // namespace hicache::ctl
