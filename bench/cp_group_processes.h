#pragma once

// The process half of bench/cp_group_bench: real hicached processes, the
// bench as a scheduler client over gRPC (unix sockets), side by side:
//  * "single": one standalone daemon serving both ranks of C = 2;
//  * "group":  a leader (--ranks=0, --listen_tcp=127.0.0.1:0) and a
//    follower (--ranks=1, --cp_group_leader=<the leader's target>) linked
//    over Gloo TCP on 127.0.0.1, heartbeats at hicached's default unless
//    told otherwise.
// Per backup (a zigzag key over ranks 0 and 1, one backup at a time):
// Allocate with owners, prepare on the scheduler's BackupSession stream,
// layer_stored of every step but the last and wait for their step_done,
// Insert with the backup attached, then time layer_stored(final step) ->
// the backup's `committed` (BackupEnded) on the stream; the whole backup
// (prepare -> committed) is timed too. Then the key is evicted (Evict RPC,
// untimed). After the backups: MatchPrefix of an absent key and Allocate
// (then Free, untimed), each timed on the standalone daemon and on the
// leader, interleaved.
//
// The daemons are stopped with SIGTERM (SIGKILL after 10 s) when the run
// ends, also after an error; their logs go to a temporary directory that
// is removed afterwards (kept, and named, on an error).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hicache::bench {

struct ProcessBenchOptions {
  std::string daemon;  // hicached; empty: //daemon:hicached's runfile.
  const char* argv0 = "";
  int iterations = 1000;
  int warmup = 50;
  int tree_calls = 2000;
  int pages = 8;
  uint32_t page_size = 16;
  std::string kv_preset = "tiny";
  int heartbeat_ms = 0;  // 0: hicached's default (--cp_group_heartbeat_ms).
  int timeout_ms = 0;    // 0: hicached's default (--cp_group_timeout_ms).
};

// Samples in microseconds, index 0 = standalone daemon, 1 = group.
struct ProcessBenchResult {
  std::vector<double> final_step_to_commit[2];
  std::vector<double> prepare_to_commit[2];
  std::vector<double> match[2];
  std::vector<double> allocate[2];
  uint32_t num_steps = 0;
  std::string group_state;  // The leader's cp_group state at the end.
  int64_t group_deaths = 0;
};

absl::StatusOr<ProcessBenchResult> RunProcessBench(
    const ProcessBenchOptions& options);

}  // namespace hicache::bench
