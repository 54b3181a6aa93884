#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::ctl {

// What every cache command gets.
struct CommandContext {
  v1::HiCache::Stub* stub;
  std::string target;
  bool json = false;
  absl::Duration timeout = absl::Seconds(5);
  std::ostream* out;
  std::ostream* err;
};

// True for the commands below.
bool IsCacheCommand(const std::string& command);

// Runs tree, node, match, cache-stats, sessions, evict, pin, unpin,
// free-room or watch with its own arguments; returns the exit code
// (0 ok, 1 daemon error, 2 usage).
int RunCacheCommand(const std::string& command,
                    const std::vector<std::string>& args,
                    const CommandContext& context);

// Help text for these commands.
std::string CacheCommandsUsage();

// "0x3,1x2,0": run-length form of a page-owner list.
std::string CompactOwners(const std::vector<uint32_t>& owners);

}  // namespace hicache::ctl
