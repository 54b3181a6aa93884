#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/group/group_wire.h"
#include "daemon/transfer/transfer_engine.h"

namespace hicache::group {

// CopyTally: one side's accounting of the copy stream on one link
// (docs/cp-groups.md, "Step deadline and accounting digest"). The leader
// tallies every rank copy it ships to a follower, in the order of its Tasks
// frames; the follower tallies every rank copy it accepted (passed its
// checks) and counts the ones it refused, in the order it received them.
// Frames are delivered in order, so after the same number of Tasks frames
// both tallies are equal unless the two sides disagree about what was
// copied: a Digest compares them.
//
// Per rank: the pools' geometry (device and host pages per rank; 0 when not
// known), copies and pages by direction, copies refused, and an ordered
// 64-bit hash chaining every accepted copy's (op, direction, step, rank,
// device pages, host pages). The hash is XXH3 over little-endian values, the
// same on every daemon of a group (one build).
//
// Not thread-safe: the owner serializes (the leader's sender thread, the
// follower's link thread).
class CopyTally {
 public:
  // `ranks`: the ranks accounted (a copy of any other rank is ignored by
  // Add and AddRefused; callers check ranks before). Pages per rank: the
  // pools' geometry, 0 when not known.
  CopyTally(std::vector<Rank> ranks, int64_t device_pages_per_rank,
            int64_t host_pages_per_rank);

  // One Tasks frame (call once per frame, before or after its copies).
  void CountFrame() { ++tasks_frames_; }
  // One rank copy accepted (leader: shipped; follower: passed its checks).
  void Add(uint64_t op_id, TransferDirection direction, uint32_t step,
           const RankCopy& copy);
  // Every rank copy of `task`.
  void AddTask(const TransferTask& task);
  // One rank copy the follower refused.
  void AddRefused(Rank rank);

  uint64_t tasks_frames() const { return tasks_frames_; }
  // The digest as of now (ranks ascending).
  Digest Snapshot() const;

  // Tests: adds `pages` host pages to the device->host count of `rank`, as
  // a lost or doubled copy would.
  void SkewForTesting(Rank rank, int64_t pages);

 private:
  RankTally* Find(Rank rank);

  uint64_t tasks_frames_ = 0;
  std::vector<RankTally> ranks_;  // Ascending.
};

// The hash of one rank copy (what CopyTally chains).
uint64_t CopyHash(uint64_t op_id, TransferDirection direction, uint32_t step,
                  const RankCopy& copy);

// Where `follower` differs from `leader`, field by field, on one line:
// "tasks frames: leader 12, follower 11; rank 3 pages host->device: leader
// 1200, follower 1199; ...". Empty when they agree. A geometry field the
// leader does not know (0) is not compared; ranks missing on either side
// are named.
std::string DescribeDivergence(uint64_t leader_frames,
                               const std::vector<RankTally>& leader,
                               uint64_t follower_frames,
                               const std::vector<RankTally>& follower);

// "rank 2: copies d2h 10 h2d 4, pages d2h 640 h2d 256, refused 0, hash
// 0x1f..., pools 32/64 pages; rank 3: ..." for logs.
std::string DescribeTallies(const std::vector<RankTally>& ranks);

}  // namespace hicache::group
