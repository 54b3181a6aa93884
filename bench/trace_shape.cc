#include "bench/trace_shape.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"

namespace hicache {
namespace {

// Nearest-rank percentile of sorted `v` (0 when empty).
double Percentile(const std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  const size_t rank = static_cast<size_t>(
      std::max(1.0, std::ceil(p / 100.0 * static_cast<double>(v.size()))));
  return static_cast<double>(v[std::min(rank, v.size()) - 1]);
}

}  // namespace

TraceShape MeasureShape(const BlockTrace& trace) {
  TraceShape shape;
  shape.requests = trace.num_requests();
  shape.references = trace.total_blocks();
  shape.unique_blocks = trace.unique_blocks();
  std::vector<int64_t> uses(trace.unique_blocks(), 0);
  std::vector<int64_t> last_position(trace.unique_blocks(), -1);
  std::vector<int64_t> last_request(trace.unique_blocks(), -1);
  std::vector<int64_t> distances;
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    for (int64_t i = trace.request_begin[r]; i < trace.request_begin[r + 1];
         ++i) {
      const int64_t block = trace.blocks[i];
      if (last_request[block] == r) continue;  // Once per request.
      ++uses[block];
      if (last_position[block] >= 0) {
        distances.push_back(i - last_position[block]);
      }
      last_position[block] = i;
      last_request[block] = r;
    }
  }
  int64_t once = 0;
  int64_t refs_once = 0;
  for (int64_t b = 0; b < trace.unique_blocks(); ++b) {
    if (uses[b] == 1) ++once;
  }
  for (int64_t block : trace.blocks) {
    if (uses[block] == 1) ++refs_once;
  }
  if (shape.unique_blocks > 0) {
    shape.unique_used_once = static_cast<double>(once) / shape.unique_blocks;
  }
  if (shape.references > 0) {
    shape.refs_to_used_once =
        static_cast<double>(refs_once) / shape.references;
  }
  std::sort(distances.begin(), distances.end());
  shape.reuse_p25 = Percentile(distances, 25);
  shape.reuse_p50 = Percentile(distances, 50);
  shape.reuse_p75 = Percentile(distances, 75);
  shape.reuse_p90 = Percentile(distances, 90);
  std::vector<int64_t> per_request;
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    per_request.push_back(trace.request_begin[r + 1] - trace.request_begin[r]);
  }
  std::sort(per_request.begin(), per_request.end());
  shape.blocks_p50 = Percentile(per_request, 50);
  shape.blocks_p90 = Percentile(per_request, 90);
  shape.blocks_p99 = Percentile(per_request, 99);
  shape.infinite_hit_rate = InfiniteRate(trace).rate();
  return shape;
}

std::string ShapeJson(const TraceShape& s) {
  return absl::StrFormat(
      "{\"requests\": %d, \"references\": %d, \"unique_blocks\": %d, "
      "\"unique_used_once\": %.4f, \"refs_to_used_once\": %.4f, "
      "\"reuse_p25\": %.0f, \"reuse_p50\": %.0f, \"reuse_p75\": %.0f, "
      "\"reuse_p90\": %.0f, \"blocks_p50\": %.0f, \"blocks_p90\": %.0f, "
      "\"blocks_p99\": %.0f, \"infinite_hit_rate\": %.4f}",
      s.requests, s.references, s.unique_blocks, s.unique_used_once,
      s.refs_to_used_once, s.reuse_p25, s.reuse_p50, s.reuse_p75, s.reuse_p90,
      s.blocks_p50, s.blocks_p90, s.blocks_p99, s.infinite_hit_rate);
}

void PrintShapeTable(const TraceShape& s, std::ostream& out) {
  out << absl::StrFormat(
      "requests | %d\nblock references | %d\nunique blocks | %d\n"
      "unique blocks used once | %.1f%%\n"
      "references to blocks used once | %.1f%%\n"
      "reuse distance p25 / p50 / p75 / p90 (block references) | "
      "%.0f / %.0f / %.0f / %.0f\n"
      "blocks per request p50 / p90 / p99 | %.0f / %.0f / %.0f\n"
      "infinite-cache hit rate | %.2f%%\n",
      s.requests, s.references, s.unique_blocks, 100 * s.unique_used_once,
      100 * s.refs_to_used_once, s.reuse_p25, s.reuse_p50, s.reuse_p75,
      s.reuse_p90, s.blocks_p50, s.blocks_p90, s.blocks_p99,
      100 * s.infinite_hit_rate);
}

}  // namespace hicache
