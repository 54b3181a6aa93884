#pragma once

// hicachectl shm: the daemons' shared-memory segments on this machine,
// without a daemon (docs/operations.md, "Shared memory").
//
// A daemon instance <id> owns /dev/shm/hicache-<id>-<kind>-r<rank> (its
// pools), /dev/shm/hicache-<id>-host-r<rank>-g<16 hex> (a host tier kept
// for hot restart) and holds an flock on /dev/shm/hicache-<id>.lock while it
// runs. An instance is
//  - live: a process holds its lock (the pid it wrote is shown);
//  - stopped: its lock file is there and nobody holds it (SIGKILLed, or
//    stopped with a host tier kept for the next start);
//  - orphaned: segments and no lock file (e.g. a package purged, or a
//    version before instance locks).
// `list` shows them; `clean` removes the segments and lock file of every
// instance that is not live (or of --instance only): what a daemon started
// on that instance would reclaim, and the host tier a hot restart would have
// reattached. It takes the instance's lock first, so a daemon that starts
// meanwhile is never cut out from under; only regular files owned by this
// user are removed (root: any).

#include <cstdint>
#include <string>
#include <vector>

#include "client/ctl/cache_commands.h"

namespace hicache::ctl {

struct ShmOptions {
  std::string dir = "/dev/shm";  // --shm_dir (tests).
  std::string instance;          // clean: only this one.
  bool dry_run = false;          // clean: say what would go.
};

struct ShmSegmentInfo {
  std::string name;         // File name in the directory.
  uint64_t bytes = 0;       // st_size.
  uint64_t resident = 0;    // st_blocks * 512: memory it holds.
  uint32_t uid = 0;
};

struct ShmInstanceInfo {
  std::string id;
  enum class State { kLive, kStopped, kOrphaned } state = State::kOrphaned;
  std::string pid;  // What the lock file records (live or stopped).
  std::vector<ShmSegmentInfo> segments;
};

// The instances in `dir`, by id; entries that are not hicached's are
// ignored. Never changes anything (a lock probe is released at once).
std::vector<ShmInstanceInfo> ScanShm(const std::string& dir);

// The instance id of a segment file name, or "" when it is not one
// ("hicache-<id>-<kind>-r<digits>" or "hicache-<id>-host-r<digits>-g<16
// hex>").
std::string InstanceOfSegment(const std::string& file_name);

int RunShmList(const ShmOptions& options, const CommandContext& c);
int RunShmClean(const ShmOptions& options, const CommandContext& c);

}  // namespace hicache::ctl
