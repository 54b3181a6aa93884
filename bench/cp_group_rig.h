#pragma once

// In-process rigs for bench/cp_group_bench: the commit latency a remote CP
// group follower adds (docs/cp-groups.md, "Measured: commit latency").
//
// Two daemons' worth of engine, side by side in one process:
//  * Baseline(): one HiCacheEngine serving both ranks of C = 2 locally on
//    its CpuTransferEngine (one daemon, as today).
//  * Group(): a leader HiCacheEngine with pool_ranks = {0} and a
//    RoutingTransferEngine, a GroupLeader over it, and a GroupFollower for
//    rank 1 (its own shared-memory pools, a CpuTransferEngine) admitted over
//    a REAL Gloo TCP link on 127.0.0.1 (two TCP devices, a FileStore
//    rendezvous in a temporary directory), as two daemons would have.
//
// Backup() runs one backup of a zigzag key (pages alternating over ranks
// 0 and 1) through the engine exactly as a scheduler and its workers do:
// PrepareBackups, LayerStored of every step but the last, Insert,
// AttachBackup, (by default) waiting for those copies -- the per-layer
// compute time of a real forward pass spaces the layers out -- then
// LayerStored of the last step, and times:
//  * local ack -> committed: rank 0's final StepDone reaching the engine
//    (a TransferListener between the transfer engine and the engine) to
//    an OpEvent kCommitted;
//  * local step event -> committed: an OpEvent kBackupStep(op, 0,
//    last step) to kCommitted (what a stream subscriber sees);
//  * end to end: before PrepareBackups to kCommitted.
// Rank 0 is local in both rigs, so group minus baseline is what the remote
// follower adds to a commit. Every committed key is evicted afterwards
// (device and host), so the pools never fill.
//
// Not thread-safe: one caller drives a rig. Errors are statuses; a backup
// that is skipped, rolled back or not committed within the timeout is an
// error naming why.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache::bench {

struct CommitRigOptions {
  uint32_t page_size = 16;
  std::string kv_preset = "tiny";
  int pages_per_backup = 8;  // Zigzag over ranks 0 and 1; at least 2.
  int64_t device_pages_per_rank = 256;
  int64_t host_pages_per_rank = 512;
  int transfer_workers = 2;
  // The group's heartbeats (hicached's defaults).
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  absl::Duration heartbeat_timeout = absl::Seconds(1);
  // Wait for the copies of steps 0..N-2 before storing the last step (a
  // forward pass's compute spaces layers out); false: every step back to
  // back, so the last step may queue behind earlier ones.
  bool drain_before_last_step = true;
  // A backup not committed within this is an error.
  absl::Duration backup_timeout = absl::Seconds(30);
};

// One backup, microseconds.
struct BackupTiming {
  double ack_to_commit_us = 0;   // rank 0's final StepDone -> committed
  double step_to_commit_us = 0;  // kBackupStep(rank 0, last) -> committed
  double end_to_end_us = 0;      // before PrepareBackups -> committed
};

class CommitRig {
 public:
  static absl::StatusOr<std::unique_ptr<CommitRig>> Baseline(
      const CommitRigOptions& options);
  static absl::StatusOr<std::unique_ptr<CommitRig>> Group(
      const CommitRigOptions& options);
  ~CommitRig();
  CommitRig(const CommitRig&) = delete;
  CommitRig& operator=(const CommitRig&) = delete;

  // One backup of a key unique to `key` (callers pass distinct keys).
  absl::StatusOr<BackupTiming> Backup(int64_t key);
  // Tree calls on the engine, timed in microseconds: a Match of a key the
  // tree does not hold, and Allocate of `pages_per_backup` pages (then
  // Free, untimed).
  absl::StatusOr<double> TimeMatch(int64_t key);
  absl::StatusOr<double> TimeAllocate();

  HiCacheEngine& engine();
  // "baseline" or "group"; what the rig is, for reports.
  const std::string& name() const;
  uint32_t num_steps() const;

 private:
  struct State;
  explicit CommitRig(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace hicache::bench
