#pragma once

// Offline hit-rate figures of a prefix cache over a Mooncake-format trace,
// counted in blocks (one per hash id, 512 tokens in Mooncake traces).
//
// The model, as a radix tree over the hash ids sees a trace:
//  - A block is a node of the tree of id paths: the same id under two
//    different parents is two different blocks (in a well-formed Mooncake
//    trace that never happens; ids are prefix-chained).
//  - A request's hit is its longest prefix of blocks that is cached when the
//    request arrives. Every block of the request is then accessed: cached
//    blocks are refreshed, missing ones are inserted (or bypassed, for
//    Belady) after the hit is counted.
//  - Capacity is a number of blocks; all blocks have the same size.
//
// Three figures:
//  - InfiniteRate: unbounded cache; a block is a hit if it was seen before
//    (up to the first unseen block of the request). Upper bound of all.
//  - LruRate: single-tier LRU, no bypass. All blocks of a request are
//    inserted, then least-recently-used blocks are evicted until at most
//    `capacity` remain. Within a request deeper blocks count as used
//    earlier than their ancestors, so an ancestor is always more recent
//    than its descendants and the victim is always a leaf (the cache stays
//    prefix-closed, like a radix tree's LRU eviction of leaves).
//  - BeladyBound: offline Belady with bypass. The blocks of a request are
//    processed root to leaf; a cached block's key becomes its next use (the
//    index of the next request that contains it, or never); a missing block
//    that is never used again is not inserted; otherwise it is inserted if
//    there is room, or if its next use is strictly sooner than the farthest
//    next use among cached blocks, which is evicted (ties: the deeper block
//    first; a descendant is never used later than its ancestor, so the
//    cache stays prefix-closed). Farthest-in-future with bypass is the
//    optimal offline policy for unit-size blocks; tests/bench checks it
//    against an exhaustive search on small traces.
//
// Cost: BlockTrace::Build is O(total blocks) expected (one hash lookup per
// block); LRU and Infinite are O(total blocks); Belady is
// O(total blocks * log(capacity)).
#include <cstdint>
#include <vector>

#include "bench/mooncake_trace.h"

namespace hicache {

struct CacheBoundResult {
  int64_t hit_blocks = 0;
  int64_t total_blocks = 0;
  // hit_blocks / total_blocks (0 for an empty trace).
  double rate() const {
    return total_blocks == 0 ? 0.0
                             : static_cast<double>(hit_blocks) / total_blocks;
  }
};

// A trace with its hash ids interned as nodes of the id-path tree. Build it
// once to evaluate several policies and capacities.
struct BlockTrace {
  // The node of each block of each request, requests back to back; request
  // r's blocks are blocks[request_begin[r] .. request_begin[r + 1]).
  std::vector<int64_t> blocks;
  // num_requests() + 1 entries.
  std::vector<int64_t> request_begin = {0};
  // Per node: its depth (0 for a first block of a request) and the hash id
  // it was interned from.
  std::vector<int32_t> depth;
  std::vector<int64_t> hash_id;

  static BlockTrace Build(const std::vector<TraceRequest>& trace);

  int64_t num_requests() const {
    return static_cast<int64_t>(request_begin.size()) - 1;
  }
  int64_t total_blocks() const { return static_cast<int64_t>(blocks.size()); }
  int64_t unique_blocks() const { return static_cast<int64_t>(depth.size()); }
};

CacheBoundResult InfiniteRate(const BlockTrace& trace);
CacheBoundResult InfiniteRate(const std::vector<TraceRequest>& trace);

// `capacity` in blocks; capacity <= 0 caches nothing.
CacheBoundResult LruRate(const BlockTrace& trace, int64_t capacity);
CacheBoundResult LruRate(const std::vector<TraceRequest>& trace,
                         int64_t capacity);

// `capacity` in blocks; capacity <= 0 caches nothing.
CacheBoundResult BeladyBound(const BlockTrace& trace, int64_t capacity);
CacheBoundResult BeladyBound(const std::vector<TraceRequest>& trace,
                             int64_t capacity);

}  // namespace hicache
