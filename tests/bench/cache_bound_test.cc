// bench/cache_bound: hand-made traces with known answers, the fast LRU and
// Belady against naive quadratic references on random prefix-chained
// traces, Belady against an exhaustive search of every caching policy on
// tiny traces, and monotonicity on random traces and the bundled head of
// the Mooncake trace.
#include "bench/cache_bound.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "bench/mooncake_trace.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using Ids = std::vector<std::vector<int64_t>>;

std::vector<TraceRequest> Trace(const Ids& ids) {
  std::vector<TraceRequest> trace;
  for (size_t i = 0; i < ids.size(); ++i) {
    TraceRequest r;
    r.timestamp_ms = static_cast<int64_t>(i);
    r.input_length = static_cast<int64_t>(ids[i].size()) * 512;
    r.hash_ids = ids[i];
    trace.push_back(r);
  }
  return trace;
}

// ---------------------------------------------------------------------------
// Naive references over raw ids (the random traces are prefix-chained, so an
// id is a node). Quadratic or worse; for small traces only.

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

int64_t Leading(const std::vector<int64_t>& request,
                const std::set<int64_t>& cached) {
  int64_t hits = 0;
  while (hits < static_cast<int64_t>(request.size()) &&
         cached.count(request[hits])) {
    ++hits;
  }
  return hits;
}

int64_t NaiveLru(const Ids& trace, int64_t capacity) {
  std::set<int64_t> cached;
  std::map<int64_t, int64_t> last_use;
  int64_t clock = 0, hits = 0;
  for (const auto& request : trace) {
    hits += Leading(request, cached);
    for (auto it = request.rbegin(); it != request.rend(); ++it) {
      last_use[*it] = ++clock;
      cached.insert(*it);
    }
    while (static_cast<int64_t>(cached.size()) > capacity) {
      int64_t victim = -1;
      for (int64_t c : cached) {
        if (victim < 0 || last_use[c] < last_use[victim]) victim = c;
      }
      cached.erase(victim);
    }
  }
  return hits;
}

// When `id` is next used, seen from position `pos` of request `t`: now (t)
// if it comes later in request t, else the first later request holding it.
int64_t NextUse(const Ids& trace, int64_t t, size_t pos, int64_t id) {
  for (size_t j = pos + 1; j < trace[t].size(); ++j) {
    if (trace[t][j] == id) return t;
  }
  for (size_t r = t + 1; r < trace.size(); ++r) {
    for (int64_t x : trace[r]) {
      if (x == id) return static_cast<int64_t>(r);
    }
  }
  return kNever;
}

int64_t NaiveBelady(const Ids& trace, int64_t capacity) {
  std::map<int64_t, int64_t> depth;
  for (const auto& request : trace) {
    for (size_t j = 0; j < request.size(); ++j) depth[request[j]] = j;
  }
  std::set<int64_t> cached;
  int64_t hits = 0;
  for (size_t t = 0; t < trace.size(); ++t) {
    hits += Leading(trace[t], cached);
    for (size_t j = 0; j < trace[t].size(); ++j) {
      const int64_t id = trace[t][j];
      if (cached.count(id)) continue;
      const int64_t use = NextUse(trace, t, j, id);
      if (use == kNever || capacity <= 0) continue;
      if (static_cast<int64_t>(cached.size()) < capacity) {
        cached.insert(id);
        continue;
      }
      int64_t victim = -1, victim_use = -1;
      for (int64_t c : cached) {
        const int64_t c_use = NextUse(trace, t, j, c);
        if (c_use > victim_use ||
            (c_use == victim_use && depth[c] > depth[victim])) {
          victim = c;
          victim_use = c_use;
        }
      }
      if (use < victim_use) {
        cached.erase(victim);
        cached.insert(id);
      }
    }
  }
  return hits;
}

// The best any policy can do: after each request the cache may hold any set
// of at most `capacity` blocks taken from what it held and what the request
// brought. Exhaustive over bitmasks; at most 16 distinct ids.
int64_t ExhaustiveOptimum(const Ids& trace, int64_t capacity) {
  std::map<int64_t, int> bit;
  for (const auto& request : trace) {
    for (int64_t id : request) bit.try_emplace(id, bit.size());
  }
  EXPECT_LE(bit.size(), 16u);
  std::map<uint32_t, int64_t> best = {{0u, 0}};
  for (const auto& request : trace) {
    uint32_t brought = 0;
    for (int64_t id : request) brought |= 1u << bit[id];
    std::map<uint32_t, int64_t> next;
    for (const auto& [state, value] : best) {
      int64_t hits = 0;
      while (hits < static_cast<int64_t>(request.size()) &&
             (state >> bit[request[hits]] & 1u)) {
        ++hits;
      }
      const uint32_t pool = state | brought;
      for (uint32_t keep = pool;; keep = (keep - 1) & pool) {
        if (std::popcount(keep) <= capacity) {
          int64_t& slot = next.try_emplace(keep, -1).first->second;
          slot = std::max(slot, value + hits);
        }
        if (keep == 0) break;
      }
    }
    best = std::move(next);
  }
  int64_t result = 0;
  for (const auto& [state, value] : best) result = std::max(result, value);
  return result;
}

// A random prefix-chained trace: each request continues a random prefix of
// an earlier request (or starts afresh) with new ids.
Ids RandomTrace(std::mt19937_64& rng, int requests, int max_new,
                int64_t* next_id) {
  Ids trace;
  for (int r = 0; r < requests; ++r) {
    std::vector<int64_t> ids;
    if (!trace.empty() && rng() % 4 != 0) {
      const auto& base = trace[rng() % trace.size()];
      ids.assign(base.begin(), base.begin() + rng() % (base.size() + 1));
    }
    const int fresh = static_cast<int>(rng() % (max_new + 1));
    for (int i = 0; i < fresh; ++i) ids.push_back((*next_id)++);
    if (ids.empty()) ids.push_back((*next_id)++);
    trace.push_back(ids);
  }
  return trace;
}

int64_t Blocks(const Ids& trace) {
  int64_t n = 0;
  for (const auto& r : trace) n += r.size();
  return n;
}

// ---------------------------------------------------------------------------

TEST(CacheBoundTest, InfiniteCountsBlocksSeenBeforeUpToTheFirstUnseen) {
  const auto trace = Trace({{1, 2, 3}, {1, 2, 4}, {5}, {1, 9, 3}});
  const CacheBoundResult r = InfiniteRate(trace);
  EXPECT_EQ(r.total_blocks, 10);
  // {1,2,4}: 2; {5}: 0; {1,9,3}: 1 (3 under 9 is not the 3 under 2).
  EXPECT_EQ(r.hit_blocks, 3);
  EXPECT_DOUBLE_EQ(r.rate(), 0.3);
}

TEST(CacheBoundTest, SameIdUnderAnotherParentIsAnotherBlock) {
  const BlockTrace trace = BlockTrace::Build(Trace({{1, 2}, {3, 2}, {1, 2}}));
  EXPECT_EQ(trace.num_requests(), 3);
  EXPECT_EQ(trace.total_blocks(), 6);
  EXPECT_EQ(trace.unique_blocks(), 4);
  EXPECT_EQ(trace.blocks[1], trace.blocks[5]);
  EXPECT_NE(trace.blocks[1], trace.blocks[3]);
  EXPECT_EQ(trace.depth[trace.blocks[3]], 1);
  EXPECT_EQ(trace.hash_id[trace.blocks[3]], 2);
  EXPECT_EQ(InfiniteRate(trace).hit_blocks, 2);
}

TEST(CacheBoundTest, EmptyTraceAndZeroCapacity) {
  EXPECT_EQ(InfiniteRate(Trace({})).total_blocks, 0);
  EXPECT_EQ(BeladyBound(Trace({}), 5).rate(), 0.0);
  const auto trace = Trace({{1, 2}, {1, 2}});
  EXPECT_EQ(LruRate(trace, 0).hit_blocks, 0);
  EXPECT_EQ(BeladyBound(trace, 0).hit_blocks, 0);
  EXPECT_EQ(LruRate(trace, 2).hit_blocks, 2);
  EXPECT_EQ(BeladyBound(trace, 2).hit_blocks, 2);
}

TEST(CacheBoundTest, LruEvictsTheDeepestBlockOfARequestFirst) {
  // {1,2,3} at capacity 2 keeps {1,2}: the next {1,2,3} hits 2 blocks.
  EXPECT_EQ(LruRate(Trace({{1, 2, 3}, {1, 2, 3}}), 2).hit_blocks, 2);
  // {3} evicts 2 (older than its ancestor 1): {1,2} then hits 1.
  EXPECT_EQ(LruRate(Trace({{1, 2}, {3}, {1, 2}}), 2).hit_blocks, 1);
  // Capacity 3 holds everything: {1,2} hits 2, then {3} hits 1.
  EXPECT_EQ(LruRate(Trace({{1, 2}, {3}, {1, 2}, {3}}), 3).hit_blocks, 3);
}

TEST(CacheBoundTest, BeladyBypassesBlocksNeededLaterThanTheCache) {
  // {3} is never used again: bypassed, so {1,2} hits both.
  EXPECT_EQ(BeladyBound(Trace({{1, 2}, {3}, {1, 2}}), 2).hit_blocks, 2);
  // {3} comes back after {1,2}: still bypassed (later than both).
  EXPECT_EQ(BeladyBound(Trace({{1, 2}, {3}, {1, 2}, {3}}), 2).hit_blocks, 2);
}

TEST(CacheBoundTest, BeladyEvictsTheDeeperOfEqualNextUses) {
  // {3} is needed sooner than 1 and 2 (both next used at request 3): the
  // deeper 2 goes, so the last request still hits its prefix {1}. Evicting
  // 1 would leave 2 cached but useless to a radix tree.
  EXPECT_EQ(BeladyBound(Trace({{1, 2}, {3}, {3}, {1, 2}}), 2).hit_blocks, 2);
}

TEST(CacheBoundTest, TheOverloadsAgree) {
  std::mt19937_64 rng(7);
  int64_t next_id = 0;
  const auto trace = Trace(RandomTrace(rng, 60, 4, &next_id));
  const BlockTrace blocks = BlockTrace::Build(trace);
  EXPECT_EQ(InfiniteRate(trace).hit_blocks, InfiniteRate(blocks).hit_blocks);
  EXPECT_EQ(LruRate(trace, 9).hit_blocks, LruRate(blocks, 9).hit_blocks);
  EXPECT_EQ(BeladyBound(trace, 9).hit_blocks,
            BeladyBound(blocks, 9).hit_blocks);
}

TEST(CacheBoundTest, MatchesNaiveReferencesOnRandomTraces) {
  std::mt19937_64 rng(20240516);
  for (int round = 0; round < 300; ++round) {
    int64_t next_id = 0;
    const Ids ids = RandomTrace(rng, 5 + rng() % 40, 1 + rng() % 6, &next_id);
    const BlockTrace trace = BlockTrace::Build(Trace(ids));
    ASSERT_EQ(trace.unique_blocks(), next_id);
    for (int64_t capacity : {0, 1, 2, 3, 5, 8, 13, 30, 1000}) {
      SCOPED_TRACE(::testing::Message()
                   << "round " << round << " capacity " << capacity);
      const CacheBoundResult lru = LruRate(trace, capacity);
      const CacheBoundResult belady = BeladyBound(trace, capacity);
      ASSERT_EQ(lru.total_blocks, Blocks(ids));
      ASSERT_EQ(lru.hit_blocks, NaiveLru(ids, capacity));
      ASSERT_EQ(belady.hit_blocks, NaiveBelady(ids, capacity));
    }
  }
}

TEST(CacheBoundTest, BeladyIsOptimalOnTinyTraces) {
  std::mt19937_64 rng(99);
  for (int round = 0; round < 300; ++round) {
    int64_t next_id = 0;
    Ids ids;
    // Keep to at most 12 distinct ids for the exhaustive search.
    do {
      next_id = 0;
      ids = RandomTrace(rng, 4 + rng() % 7, 1 + rng() % 3, &next_id);
    } while (next_id > 12);
    const BlockTrace trace = BlockTrace::Build(Trace(ids));
    for (int64_t capacity = 1; capacity <= 5; ++capacity) {
      SCOPED_TRACE(::testing::Message()
                   << "round " << round << " capacity " << capacity);
      const int64_t optimum = ExhaustiveOptimum(ids, capacity);
      ASSERT_EQ(BeladyBound(trace, capacity).hit_blocks, optimum);
      ASSERT_LE(LruRate(trace, capacity).hit_blocks, optimum);
    }
  }
}

void ExpectMonotone(const BlockTrace& trace,
                    const std::vector<int64_t>& capacities) {
  const int64_t infinite = InfiniteRate(trace).hit_blocks;
  int64_t last_belady = 0;
  for (int64_t capacity : capacities) {
    SCOPED_TRACE(::testing::Message() << "capacity " << capacity);
    const int64_t lru = LruRate(trace, capacity).hit_blocks;
    const int64_t belady = BeladyBound(trace, capacity).hit_blocks;
    EXPECT_LE(lru, belady);
    EXPECT_LE(belady, infinite);
    EXPECT_GE(belady, last_belady);
    last_belady = belady;
  }
  // Everything fits: all three agree.
  EXPECT_EQ(LruRate(trace, trace.unique_blocks()).hit_blocks, infinite);
  EXPECT_EQ(BeladyBound(trace, trace.unique_blocks()).hit_blocks, infinite);
}

TEST(CacheBoundTest, MonotoneOnRandomTraces) {
  std::mt19937_64 rng(5);
  for (int round = 0; round < 50; ++round) {
    int64_t next_id = 0;
    const BlockTrace trace = BlockTrace::Build(
        Trace(RandomTrace(rng, 200 + rng() % 200, 8, &next_id)));
    std::vector<int64_t> capacities;
    for (int64_t c = 0; c <= trace.unique_blocks(); c += 7) {
      capacities.push_back(c);
    }
    ExpectMonotone(trace, capacities);
  }
}

TEST(CacheBoundTest, MonotoneOnTheMooncakeHead) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  auto requests =
      ReadMooncakeTrace(std::string(srcdir ? srcdir : ".") +
                        "/hicache/tests/data/mooncake_head300.jsonl");
  ASSERT_TRUE(requests.ok()) << requests.status();
  const BlockTrace trace = BlockTrace::Build(*requests);
  ASSERT_EQ(trace.num_requests(), 300);
  std::vector<int64_t> capacities;
  for (int64_t c = 0; c <= trace.unique_blocks(); c += 250) {
    capacities.push_back(c);
  }
  ExpectMonotone(trace, capacities);
}

}  // namespace
}  // namespace hicache
