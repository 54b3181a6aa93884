#pragma once

// The shape of a Mooncake-format trace, counted per block (one hash id, 512
// tokens in Mooncake traces): the statistics a generated workload must match
// to stand in for real traffic (issue 25's table).
//
//  - unique_used_once: of the distinct blocks, the fraction referenced by
//    exactly one request;
//  - refs_to_used_once: of all block references, the fraction that go to
//    such blocks;
//  - reuse distance: for each reference to a block referenced before, the
//    number of block references since its previous reference (in the
//    trace's request order, blocks within a request root first); the
//    p25/p50/p75/p90 of those;
//  - blocks per request: p50/p90/p99;
//  - infinite_hit_rate: the unbounded prefix cache's hit rate
//    (bench/cache_bound.h's InfiniteRate).
// Blocks are nodes of the id-path tree (BlockTrace), so one id under two
// parents counts as two blocks. Percentiles are nearest-rank.

#include <cstdint>
#include <ostream>
#include <string>

#include "bench/cache_bound.h"

namespace hicache {

struct TraceShape {
  int64_t requests = 0;
  int64_t references = 0;
  int64_t unique_blocks = 0;
  double unique_used_once = 0;
  double refs_to_used_once = 0;
  double reuse_p25 = 0, reuse_p50 = 0, reuse_p75 = 0, reuse_p90 = 0;
  double blocks_p50 = 0, blocks_p90 = 0, blocks_p99 = 0;
  double infinite_hit_rate = 0;
};

TraceShape MeasureShape(const BlockTrace& trace);

// One JSON object (keys as the struct's fields).
std::string ShapeJson(const TraceShape& shape);
// The table rows, one "statistic | value" line each.
void PrintShapeTable(const TraceShape& shape, std::ostream& out);

}  // namespace hicache
