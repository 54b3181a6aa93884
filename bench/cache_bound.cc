#include "bench/cache_bound.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace hicache {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Leading blocks of request r that `cached` holds.
template <typename Pred>
int64_t LeadingHits(const BlockTrace& trace, int64_t r, Pred cached) {
  int64_t hits = 0;
  for (int64_t i = trace.request_begin[r]; i < trace.request_begin[r + 1];
       ++i) {
    if (!cached(trace.blocks[i])) break;
    ++hits;
  }
  return hits;
}

}  // namespace

BlockTrace BlockTrace::Build(const std::vector<TraceRequest>& trace) {
  BlockTrace out;
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int64_t> node_of;
  size_t total = 0;
  for (const TraceRequest& r : trace) total += r.hash_ids.size();
  out.blocks.reserve(total);
  out.request_begin.reserve(trace.size() + 1);
  for (const TraceRequest& r : trace) {
    int64_t parent = -1;
    int32_t depth = 0;
    for (int64_t id : r.hash_ids) {
      auto [it, inserted] = node_of.try_emplace(
          std::make_pair(parent, id), static_cast<int64_t>(out.depth.size()));
      if (inserted) {
        out.depth.push_back(depth);
        out.hash_id.push_back(id);
      }
      parent = it->second;
      out.blocks.push_back(parent);
      ++depth;
    }
    out.request_begin.push_back(static_cast<int64_t>(out.blocks.size()));
  }
  return out;
}

CacheBoundResult InfiniteRate(const BlockTrace& trace) {
  CacheBoundResult result;
  result.total_blocks = trace.total_blocks();
  std::vector<char> seen(trace.unique_blocks(), 0);
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    result.hit_blocks +=
        LeadingHits(trace, r, [&](int64_t n) { return seen[n] != 0; });
    for (int64_t i = trace.request_begin[r]; i < trace.request_begin[r + 1];
         ++i) {
      seen[trace.blocks[i]] = 1;
    }
  }
  return result;
}

CacheBoundResult LruRate(const BlockTrace& trace, int64_t capacity) {
  CacheBoundResult result;
  result.total_blocks = trace.total_blocks();
  const int64_t nodes = trace.unique_blocks();
  // Intrusive doubly linked list of cached nodes, least recent first; the
  // sentinel is `nodes`.
  const int64_t head = nodes;
  std::vector<int64_t> prev(nodes + 1, -1), next(nodes + 1, -1);
  prev[head] = next[head] = head;
  std::vector<char> cached(nodes, 0);
  int64_t size = 0;
  auto unlink = [&](int64_t n) {
    next[prev[n]] = next[n];
    prev[next[n]] = prev[n];
  };
  auto push_back = [&](int64_t n) {
    prev[n] = prev[head];
    next[n] = head;
    next[prev[head]] = n;
    prev[head] = n;
  };
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    result.hit_blocks +=
        LeadingHits(trace, r, [&](int64_t n) { return cached[n] != 0; });
    // Leaf to root, so that ancestors end up more recent.
    for (int64_t i = trace.request_begin[r + 1] - 1;
         i >= trace.request_begin[r]; --i) {
      const int64_t n = trace.blocks[i];
      if (cached[n]) {
        unlink(n);
      } else {
        cached[n] = 1;
        ++size;
      }
      push_back(n);
    }
    while (size > std::max<int64_t>(capacity, 0)) {
      const int64_t victim = next[head];
      unlink(victim);
      cached[victim] = 0;
      --size;
    }
  }
  return result;
}

CacheBoundResult BeladyBound(const BlockTrace& trace, int64_t capacity) {
  CacheBoundResult result;
  result.total_blocks = trace.total_blocks();
  const int64_t nodes = trace.unique_blocks();
  // next_use[i]: the next request after block i's that contains its node.
  std::vector<int64_t> next_use(trace.total_blocks());
  {
    std::vector<int64_t> later(nodes, kNever);
    for (int64_t r = trace.num_requests() - 1; r >= 0; --r) {
      for (int64_t i = trace.request_begin[r]; i < trace.request_begin[r + 1];
           ++i) {
        next_use[i] = later[trace.blocks[i]];
        later[trace.blocks[i]] = r;
      }
    }
  }
  // Cached nodes by (key, depth, node); the last one is the victim: the
  // farthest next use, then the deepest.
  using Entry = std::tuple<int64_t, int32_t, int64_t>;
  std::set<Entry> by_key;
  std::vector<int64_t> key(nodes, -1);  // -1: not cached
  auto entry = [&](int64_t n) { return Entry{key[n], trace.depth[n], n}; };
  for (int64_t r = 0; r < trace.num_requests(); ++r) {
    result.hit_blocks +=
        LeadingHits(trace, r, [&](int64_t n) { return key[n] >= 0; });
    for (int64_t i = trace.request_begin[r]; i < trace.request_begin[r + 1];
         ++i) {
      const int64_t n = trace.blocks[i];
      const int64_t use = next_use[i];
      if (key[n] >= 0) {
        by_key.erase(entry(n));
        key[n] = use;
        by_key.insert(entry(n));
        continue;
      }
      if (use == kNever || capacity <= 0) continue;  // bypass
      if (static_cast<int64_t>(by_key.size()) >= capacity) {
        auto victim = std::prev(by_key.end());
        if (use >= std::get<0>(*victim)) continue;  // bypass
        key[std::get<2>(*victim)] = -1;
        by_key.erase(victim);
      }
      key[n] = use;
      by_key.insert(entry(n));
    }
  }
  return result;
}

CacheBoundResult InfiniteRate(const std::vector<TraceRequest>& trace) {
  return InfiniteRate(BlockTrace::Build(trace));
}

CacheBoundResult LruRate(const std::vector<TraceRequest>& trace,
                         int64_t capacity) {
  return LruRate(BlockTrace::Build(trace), capacity);
}

CacheBoundResult BeladyBound(const std::vector<TraceRequest>& trace,
                             int64_t capacity) {
  return BeladyBound(BlockTrace::Build(trace), capacity);
}

}  // namespace hicache
