// The in-process replay (bench/replay_lib): deferred inserts never leak
// pages, deterministic runs reproduce, and the hit rates the policies reach
// on the Mooncake trace and the conversation workload do not regress
// (docs/eviction.md has the full table).
#include "bench/replay_lib.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "bench/cache_bound.h"
#include "bench/matched_trace.h"
#include "bench/mooncake_trace.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

std::vector<TraceRequest> Trace(const std::string& path, int64_t limit = -1) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  auto requests = ReadMooncakeTrace(
      std::string(srcdir ? srcdir : ".") + "/hicache/" + path, limit);
  EXPECT_TRUE(requests.ok()) << requests.status();
  return requests.ok() ? *std::move(requests) : std::vector<TraceRequest>{};
}

ReplayConfig Small(WritePolicy write, EvictionPolicy evict) {
  ReplayConfig config;
  config.l1_blocks = 300;
  config.l2_blocks = 600;
  config.write_policy = write;
  config.eviction_policy = evict;
  return config;
}

void ExpectSameFigures(const ReplayOutcome& a, const ReplayOutcome& b) {
  EXPECT_EQ(a.l1_hit_blocks, b.l1_hit_blocks);
  EXPECT_EQ(a.l12_hit_blocks, b.l12_hit_blocks);
  EXPECT_EQ(a.stats.backups_committed, b.stats.backups_committed);
  EXPECT_EQ(a.stats.loads_done, b.stats.loads_done);
  EXPECT_EQ(a.stats.device_evicted_pages, b.stats.device_evicted_pages);
  EXPECT_EQ(a.stats.host_evicted_pages, b.stats.host_evicted_pages);
  EXPECT_EQ(a.stats.host_copies_dropped, b.stats.host_copies_dropped);
  EXPECT_EQ(a.stats.write_back_rejected, b.stats.write_back_rejected);
}

TEST(ReplayTest, DeterministicRunsGiveIdenticalFigures) {
  const auto trace = Trace("tests/data/mooncake_head300.jsonl");
  for (WritePolicy write : kWritePolicies) {
    for (EvictionPolicy evict :
         {EvictionPolicy::kLru, EvictionPolicy::kTinyLfu}) {
      SCOPED_TRACE(std::string(PolicyName(write)) + " " +
                   std::string(PolicyName(evict)));
      auto first = ReplayTrace(trace, Small(write, evict));
      auto second = ReplayTrace(trace, Small(write, evict));
      ASSERT_TRUE(first.ok()) << first.status();
      ASSERT_TRUE(second.ok()) << second.status();
      ExpectSameFigures(*first, *second);
      EXPECT_GT(first->l1_hit_blocks, 0);
      EXPECT_EQ(first->leaked_pages, 0);
      EXPECT_EQ(first->failed_allocations, 0);
    }
  }
}

// /dev/shm entries whose names start with `prefix`.
std::vector<std::string> Segments(const std::string& prefix) {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  closedir(dir);
  return out;
}

// Hot restart's journal (ReplayConfig::state_dir) records the host tier and
// changes nothing the cache does: the same hits, backups, loads and
// evictions as without it. Each replay starts cold on segments of its own,
// removed when it ends.
TEST(ReplayTest, JournalingTheHostTierChangesNothing) {
  const auto trace = Trace("tests/data/mooncake_head300.jsonl");
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string state_dir =
      std::string(tmp ? tmp : "/tmp") + "/replay_state_dir";
  const std::string ours = "hicache-replay" + std::to_string(getpid()) + "-";
  int64_t recorded = 0;
  for (WritePolicy write : kWritePolicies) {
    SCOPED_TRACE(std::string(PolicyName(write)));
    ReplayConfig config = Small(write, EvictionPolicy::kTinyLfu);
    auto plain = ReplayTrace(trace, config);
    config.state_dir = state_dir;
    auto journaled = ReplayTrace(trace, config);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(journaled.ok()) << journaled.status();
    ExpectSameFigures(*plain, *journaled);
    EXPECT_FALSE(plain->persistence.enabled);
    EXPECT_TRUE(journaled->persistence.enabled);
    EXPECT_FALSE(journaled->persistence.recovered);  // Cold: fresh segments.
    EXPECT_EQ(journaled->persistence.journal_status, "OK");
    // Selective write-through backs up nothing on this short trace.
    if (journaled->stats.backups_committed > 0) {
      EXPECT_GT(journaled->persistence.journal_puts, 0);
      EXPECT_GT(journaled->persistence.journal_live, 0);
    }
    recorded += journaled->persistence.journal_puts;
    EXPECT_TRUE(std::filesystem::exists(state_dir + "/journal"));
    EXPECT_EQ(journaled->leaked_pages, 0);
    EXPECT_TRUE(Segments(ours).empty());
  }
  EXPECT_GT(recorded, 0);
}

// Slow transfers: backup completions held back for 16 requests at a time,
// so inserts find backups in flight and are deferred. Each is retried after
// the backup settles; nothing is leaked.
TEST(ReplayTest, SlowBackupsDeferInsertsAndLeakNothing) {
  const auto trace = Trace("bench/traces/mooncake_synthetic.jsonl", 1000);
  ReplayConfig config;
  config.write_policy = WritePolicy::kWriteThrough;
  config.slow_backups_for = 16;
  auto out = ReplayTrace(trace, config);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GT(out->deferred_inserts, 0);
  EXPECT_EQ(out->deferred_retried, out->deferred_inserts);
  EXPECT_EQ(out->deferred_gave_up, 0);
  EXPECT_EQ(out->leaked_pages, 0);
  EXPECT_EQ(out->failed_allocations, 0);
}

// Without retries every deferred insert gives up: its backup is rolled back
// and its pages are freed (the original bench leaked them here).
TEST(ReplayTest, GivingUpOnADeferredInsertFreesItsPages) {
  const auto trace = Trace("bench/traces/mooncake_synthetic.jsonl", 1000);
  ReplayConfig config;
  config.write_policy = WritePolicy::kWriteThrough;
  config.slow_backups_for = 16;
  config.defer_retries = 0;
  auto out = ReplayTrace(trace, config);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GT(out->deferred_gave_up, 0);
  EXPECT_EQ(out->deferred_gave_up, out->deferred_inserts);
  EXPECT_EQ(out->leaked_pages, 0);
  EXPECT_EQ(out->failed_allocations, 0);
}

// The goal on the Mooncake trace with L1 = 6000 and L2 = 12000
// blocks (bench/traces/mooncake_synthetic.jsonl): write_back + tinylfu
// reaches 58.21% L1+L2 (91.0% of the 63.96% offline bound), with L1 no
// worse than LRU's 31.0%, and beats write-back LRU. The daemon's default,
// write_ahead + tinylfu, reached 57.35% (89.7%) when it became the default:
// it pays for a prefix-closed host tier (docs/eviction.md) and may not
// regress either.
TEST(ReplayTest, MooncakeHitRatesDoNotRegress) {
  const auto trace = Trace("bench/traces/mooncake_synthetic.jsonl");
  ASSERT_EQ(trace.size(), 3993u);
  ReplayConfig config;  // L1 6000, L2 12000 blocks.
  config.write_policy = WritePolicy::kWriteBack;
  config.eviction_policy = EvictionPolicy::kTinyLfu;
  auto tinylfu = ReplayTrace(trace, config);
  ASSERT_TRUE(tinylfu.ok()) << tinylfu.status();
  config.eviction_policy = EvictionPolicy::kLru;
  auto lru = ReplayTrace(trace, config);
  ASSERT_TRUE(lru.ok()) << lru.status();
  const double bound =
      BeladyBound(BlockTrace::Build(trace), 18000).rate();
  EXPECT_NEAR(bound, 0.6396, 0.0001);
  EXPECT_GE(tinylfu->l12_rate(), 0.5800);
  EXPECT_GE(tinylfu->l12_rate(), 0.90 * bound);
  EXPECT_GE(tinylfu->l1_rate(), 0.3100);
  EXPECT_GE(lru->l12_rate(), 0.5480);  // Exclusive tiers alone.
  EXPECT_GT(tinylfu->l12_rate(), lru->l12_rate() + 0.02);
  EXPECT_EQ(tinylfu->leaked_pages, 0);
  ReplayConfig defaults;  // The daemon's pair.
  ASSERT_EQ(defaults.write_policy, WritePolicy::kWriteAhead);
  ASSERT_EQ(defaults.eviction_policy, EvictionPolicy::kTinyLfu);
  auto ahead = ReplayTrace(trace, defaults);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_GE(ahead->l12_rate(), 0.5725);
  EXPECT_GE(ahead->l1_rate(), 0.3100);
  EXPECT_EQ(ahead->stats.copy_waits, 0);
  EXPECT_EQ(ahead->leaked_pages, 0);
}

// Issue 28's goal: the daemon's defaults with a storage tier of 100,000
// blocks below L1 = 6000 and L2 = 12000 (a file store in a temporary
// directory) reach at least 95% of the infinite cache's 63.96% on the
// Mooncake trace (63.94%, 100.0%, when it was built), byte counts intact.
TEST(ReplayTest, StorageTierReachesTheInfiniteCache) {
  const auto trace = Trace("bench/traces/mooncake_synthetic.jsonl");
  ReplayConfig config;  // The daemon's pair, L1 6000, L2 12000 blocks.
  config.l3_blocks = 100000;
  auto out = ReplayTrace(trace, config);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GE(out->l123_rate(), 0.95 * 0.6396);
  EXPECT_GT(out->l123_rate(), out->l12_rate() + 0.05);
  EXPECT_GT(out->stats.storage_promoted_pages, 0);
  EXPECT_EQ(out->stats.storage_promotions_failed, 0);
  EXPECT_EQ(out->store.checksum_failures, 0);
  EXPECT_EQ(out->leaked_pages, 0);
}

// The multi-turn conversation workload (bench/traces/conversations.jsonl,
// first 4,000 requests): the default write policy (write_ahead) with LRU or
// TinyLFU stays near the bound (97.2-97.3%; write_back the same).
TEST(ReplayTest, ConversationHitRatesDoNotRegress) {
  const auto trace = Trace("bench/traces/conversations.jsonl", 4000);
  ASSERT_EQ(trace.size(), 4000u);
  ReplayConfig config;
  config.l1_blocks = 1500;
  config.l2_blocks = 3000;
  const double bound = BeladyBound(BlockTrace::Build(trace), 4500).rate();
  for (EvictionPolicy evict :
       {EvictionPolicy::kLru, EvictionPolicy::kTinyLfu}) {
    config.eviction_policy = evict;
    auto out = ReplayTrace(trace, config);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_GE(out->l12_rate(), 0.93 * bound) << PolicyName(evict);
    EXPECT_EQ(out->leaked_pages, 0);
  }
}

// The matched workload (bench/matched_trace.h: the shape of the Mooncake
// conversation trace the goals are set on), L1 = 6000 and L2 =
// 12000 blocks: write_back + tinylfu reached 32.39% L1+L2 (84.4% of the
// 38.38% bound) and the default, write_ahead + tinylfu, 32.01% (83.4%) with
// the host tier's reuse credit (31.94% and 31.49% without it) when this was
// written (docs/eviction.md). Neither may regress; write_ahead never waits
// for a copy.
TEST(ReplayTest, MatchedHitRatesDoNotRegress) {
  auto trace = GenerateMatchedTrace({});
  ASSERT_TRUE(trace.ok()) << trace.status();
  ReplayConfig config;  // L1 6000, L2 12000 blocks.
  config.eviction_policy = EvictionPolicy::kTinyLfu;
  const double bound = BeladyBound(BlockTrace::Build(*trace), 18000).rate();
  EXPECT_NEAR(bound, 0.3838, 0.0001);
  config.write_policy = WritePolicy::kWriteBack;
  auto back = ReplayTrace(*trace, config);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_GE(back->l12_rate(), 0.3235);
  EXPECT_EQ(back->leaked_pages, 0);
  config.write_policy = WritePolicy::kWriteAhead;
  auto ahead = ReplayTrace(*trace, config);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  EXPECT_GE(ahead->l12_rate(), 0.3195);
  EXPECT_EQ(ahead->stats.copy_waits, 0);
  EXPECT_GT(ahead->stats.write_ahead_backups, 0);
  EXPECT_EQ(ahead->leaked_pages, 0);
}

}  // namespace
}  // namespace hicache
