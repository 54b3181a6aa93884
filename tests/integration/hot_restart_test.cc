// Hot restart (issue 15, docs/hot-restart.md) end to end: the real hicached
// with --state_dir, stopped with real signals (SIGKILL mid-traffic, SIGTERM),
// its host segments and journal damaged on disk, restarted (also from a copy
// of the binary in another directory). After each restart: what persistence
// reports, which prefixes are host hits, and every byte of what loads back,
// on every rank (the fixture, hot_restart_fixture.h, is the scheduler).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/hot_restart_fixture.h"
#include "tests/testing/binaries.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache::hot_restart {
namespace {

using ::testing::HasSubstr;
class SigkillTest : public HotRestartTest,
                    public ::testing::WithParamInterface<uint32_t> {};

TEST_P(SigkillTest, CommittedPrefixesComeBackByteExactPendingOnesDoNot) {
  const uint32_t cp = GetParam();
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  ASSERT_TRUE(Stats().persistence().enabled());
  ASSERT_GE(layout_.num_steps(), 2u);  // A backup can be left half stored.
  // Committed: two roots and an extension of the first (a child node).
  const std::vector<int32_t> a = Tokens(1000, 5);
  const std::vector<int32_t> b = Tokens(2000, 3);
  const std::vector<int32_t> a_ext = Concat(a, Tokens(3000, 3));
  ASSERT_NE(Request(a), 0u);
  ASSERT_NE(Request(b), 0u);
  ASSERT_NE(Request(a_ext), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(3));
  // Pending at the kill: a new root and an extension of b, one layer
  // stored of each.
  const std::vector<int32_t> q = Tokens(5000, 4);
  const std::vector<int32_t> b_ext = Concat(b, Tokens(6000, 2));
  ASSERT_NE(Request(q, 1), 0u);
  ASSERT_NE(Request(b_ext, 1), 0u);
  EXPECT_EQ(Stats().pending_backups(), 2);
  EXPECT_EQ(HostHit(q), 0);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  EXPECT_EQ(HostSegments().size(), cp) << "host segments kept";

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.recovered()) << p.DebugString();
  EXPECT_EQ(p.cold_reason(), "");
  EXPECT_EQ(p.nodes_recovered(), 3) << p.DebugString();
  EXPECT_GE(p.pages_recovered(), 5 + 3 + 3) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum(), 0);
  EXPECT_EQ(p.dropped_orphan(), 0);
  EXPECT_EQ(p.dropped_conflict(), 0);
  EXPECT_GT(p.verified_bytes(), 0u);
  EXPECT_EQ(p.journal_status(), "OK");
  EXPECT_EQ(DevicePagesAllocated(), 0) << "the device tier starts empty";
  EXPECT_EQ(Stats().pending_backups(), 0);
  // Host hits of the whole committed prefixes; nothing pending is served.
  EXPECT_EQ(HostHit(a), static_cast<int64_t>(a.size()));
  EXPECT_EQ(HostHit(b), static_cast<int64_t>(b.size()));
  EXPECT_EQ(HostHit(a_ext), static_cast<int64_t>(a_ext.size()));
  EXPECT_EQ(HostHit(q), 0);
  EXPECT_EQ(HostHit(b_ext), static_cast<int64_t>(b.size()));
  // Every byte comes back, on every rank.
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(a_ext));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(b));
  // A fresh request on the recovered cache works and is journaled.
  ASSERT_NE(Request(Tokens(7000, 2)), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

INSTANTIATE_TEST_SUITE_P(CpSizes, SigkillTest, ::testing::Values(1u, 4u));

// SIGKILL while a thread drives requests (roots and extensions; device and
// host evictions under pressure; backups in flight) once part of that
// traffic is durable. Whatever comes back is byte-exact on every rank.
// Nodes may be dropped at recovery: a host eviction's Drop not yet durable
// at the kill leaves a stale Put whose pages were reused, which fails its
// checksums (docs/hot-restart.md §4); none of them may be served.
//
// Commits are journaled at once (--journal_settle_ms=0): this host tier is
// turned over within milliseconds, so hardly a commit would live the default
// 20 ms and nothing would be durable to test (recovered or dropped) at the
// kill.
TEST_P(SigkillTest, KillUnderConcurrentTrafficServesOnlyVerifiedKv) {
  const uint32_t cp = GetParam();
  std::vector<std::string> flags = Flags(cp);
  flags.push_back("--journal_settle_ms=0");
  ASSERT_NO_FATAL_FAILURE(Start(flags));
  const uint64_t empty_journal = Stats().persistence().journal_file_bytes();
  std::vector<std::vector<int32_t>> issued;
  constexpr int kRequests = 5000;  // More than the kill lets through.
  for (int i = 0; i < kRequests; ++i) {
    const std::vector<int32_t> root = Tokens(10000 + 100 * i, 1 + i % 3);
    issued.push_back(i % 2 == 0 ? root : Concat(issued.back(), root));
  }
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0}, completed{0};
  std::thread traffic([&] {
    for (size_t i = 0; i < issued.size() && !stop.load(); ++i) {
      completed.fetch_add(TryRequest(issued[i]) ? 1 : 0);
      sent.fetch_add(1);
    }
  });
  // Kill mid-traffic, once 80 backups committed (the host tier, 64 pages a
  // rank, has been evicting for a while) and some Puts are durable.
  // (A generous bound: the journal's threads run at low priority.)
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (absl::Now() < deadline && sent.load() < kRequests) {
    const v1::CacheStats stats = Stats();
    if (stats.backups_committed() >= committed_ + 80 &&
        stats.persistence().journal_file_bytes() > empty_journal) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_TRUE(daemon_->Signal(SIGKILL).ok());
  ASSERT_TRUE(daemon_->Wait(absl::Seconds(10)).ok());
  stop.store(true);
  traffic.join();
  Disconnect();
  ASSERT_GT(completed.load(), 5) << "of " << sent.load();

  ASSERT_NO_FATAL_FAILURE(Start(flags));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.recovered()) << p.DebugString();
  // Some records were durable at the kill (the wait above saw them); on a
  // slow disk all of them may have been evicted and their pages reused
  // since, so they may all be dropped: never served.
  EXPECT_GT(p.nodes_recovered() + p.dropped_checksum() + p.dropped_orphan() +
                p.dropped_conflict(),
            0)
      << p.DebugString();
  EXPECT_EQ(DevicePagesAllocated(), 0);
  int64_t hit_tokens = 0;
  for (int i = 0; i < sent.load(); ++i) {
    const int64_t hit = HostHit(issued[i]);
    ASSERT_EQ(hit % page_size_, 0);
    if (hit == 0) continue;
    hit_tokens += hit;
    const std::vector<int32_t> prefix(issued[i].begin(),
                                      issued[i].begin() + hit);
    ASSERT_NO_FATAL_FAILURE(LoadAndVerify(prefix)) << "request " << i;
  }
  std::fprintf(stderr,
               "cp %u: %d requests sent, %d completed; recovered %lld nodes, "
               "dropped %lld (checksum) %lld (orphan) %lld (conflict); %lld "
               "tokens hit and verified\n",
               cp, sent.load(), completed.load(),
               static_cast<long long>(p.nodes_recovered()),
               static_cast<long long>(p.dropped_checksum()),
               static_cast<long long>(p.dropped_orphan()),
               static_cast<long long>(p.dropped_conflict()),
               static_cast<long long>(hit_tokens));
  // Every recovered node is the end of some request's prefix.
  if (p.nodes_recovered() > 0) {
    EXPECT_GT(hit_tokens, 0) << p.DebugString();
  }
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

TEST_F(HotRestartTest, CorruptedHostPageDropsItsNodeAndSubtreeOnly) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  const std::vector<int32_t> a_ext = Concat(a, Tokens(3000, 2));
  const std::vector<int32_t> c = Tokens(2000, 4);
  const uint64_t node_a = Request(a);
  ASSERT_NE(node_a, 0u);
  ASSERT_NE(Request(a_ext), 0u);
  ASSERT_NE(Request(c), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(3));
  // A's host pages, rank by rank.
  v1::NodeInfo info;
  ASSERT_NO_FATAL_FAILURE(Inspect(node_a, &info));
  ASSERT_EQ(info.host_pages_by_rank_size(), static_cast<int>(cp))
      << info.DebugString();
  uint32_t rank = 0;
  while (rank < cp && info.host_pages_by_rank(rank).pages_size() == 0) ++rank;
  ASSERT_LT(rank, cp) << info.DebugString();
  const int64_t host_page = info.host_pages_by_rank(rank).pages(0);
  const std::string segment = ShmPath(layout_.ranks(rank).host().name());
  ASSERT_GT(layout_.host_blocks_size(), 0);
  const v1::BlockAddress& block =
      layout_.host_blocks(layout_.host_blocks_size() - 1);
  const uint64_t offset = block.offset() + host_page * block.page_stride() +
                          block.block_bytes() / 2;
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));

  // Flip one byte of that page while the daemon is down.
  {
    const int fd = open(segment.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << segment;
    uint8_t byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, offset), 1);
    byte ^= 0x5A;
    ASSERT_EQ(pwrite(fd, &byte, 1, offset), 1);
    close(fd);
  }

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.recovered()) << p.DebugString();
  EXPECT_GE(p.dropped_checksum(), 1) << p.DebugString();
  EXPECT_EQ(p.nodes_recovered(), 1) << p.DebugString();  // c only.
  EXPECT_THAT(daemon_->Stderr(), HasSubstr("host tier recovered"));
  // The corrupted node and its child are never served; c is, byte-exact.
  EXPECT_EQ(HostHit(a), 0);
  EXPECT_EQ(HostHit(a_ext), 0);
  auto miss = session_->LoadBack(a);
  ASSERT_TRUE(miss.ok()) << miss.status();
  EXPECT_EQ(miss->started.loaded_tokens(), 0);
  if (miss->lock_handle() != 0) {
    ASSERT_TRUE(session_->UnlockHandles({miss->lock_handle()}).ok());
  }
  EXPECT_EQ(HostHit(c), static_cast<int64_t>(c.size()));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(c));
  // The dropped prefix can be cached again.
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

TEST_F(HotRestartTest, TornJournalTailKeepsEverythingBeforeIt) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  // Three roots, each committed before the next starts: the journal's last
  // record is the third's Put.
  const std::vector<std::vector<int32_t>> prefixes = {
      Tokens(1000, 3), Tokens(2000, 2), Tokens(3000, 4)};
  for (const auto& tokens : prefixes) ASSERT_NE(Request(tokens), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(3));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  const std::string journal = state_dir_ + "/journal";
  const int64_t size = FileSize(journal);
  ASSERT_GT(size, 7);
  ASSERT_EQ(truncate(journal.c_str(), size - 7), 0);

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.recovered()) << p.DebugString();
  EXPECT_EQ(p.nodes_recovered(), 2) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum() + p.dropped_orphan() + p.dropped_conflict(),
            0);
  EXPECT_THAT(daemon_->Stderr(), HasSubstr("the journal's last"));
  EXPECT_EQ(HostHit(prefixes[0]), static_cast<int64_t>(prefixes[0].size()));
  EXPECT_EQ(HostHit(prefixes[1]), static_cast<int64_t>(prefixes[1].size()));
  EXPECT_EQ(HostHit(prefixes[2]), 0);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(prefixes[0]));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(prefixes[1]));
  // It serves, and journals again: the lost prefix is cached anew and
  // survives the next restart.
  ASSERT_NE(Request(prefixes[2]), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  EXPECT_EQ(Stats().persistence().nodes_recovered(), 3);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(prefixes[2]));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

TEST_F(HotRestartTest, PageSizeChangeRemovesOldSegmentsAndStartsCold) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
  const std::vector<std::string> old_segments = HostSegments();
  ASSERT_EQ(old_segments.size(), cp);

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp, 2 * kPageSize)));
  ASSERT_EQ(page_size_, 2 * kPageSize);
  for (const std::string& name : old_segments) {
    EXPECT_LT(FileSize(ShmPath(name)), 0) << name << " was kept";
  }
  const std::vector<std::string> new_segments = HostSegments();
  EXPECT_EQ(new_segments.size(), cp);
  for (const std::string& name : new_segments) {
    EXPECT_THAT(old_segments, ::testing::Not(::testing::Contains(name)));
  }
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.enabled());
  EXPECT_FALSE(p.recovered()) << p.DebugString();
  EXPECT_NE(p.cold_reason(), "");
  EXPECT_EQ(p.nodes_recovered(), 0);
  EXPECT_THAT(daemon_->Stderr(), HasSubstr("host tier: starting cold"));
  EXPECT_EQ(HostHit(a), 0);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

TEST_F(HotRestartTest, SigtermThenBinaryFromAnotherDirectoryRecoversAll) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  const std::vector<int32_t> a_ext = Concat(a, Tokens(4000, 2));
  const std::vector<int32_t> b = Tokens(2000, 3);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NE(Request(a_ext), 0u);
  ASSERT_NE(Request(b), 0u);
  // Evict the device copies: host-only nodes survive as well.
  {
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    for (uint32_t r = 0; r < cp; ++r) evict.add_device_pages_per_lane(1 << 20);
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub_->Evict(&ctx, evict, &evicted).ok());
    EXPECT_GT(evicted.device_pages_freed(), 0);
  }
  // No wait for the journal: SIGTERM flushes it.
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));

  // The "new build": a copy of the binary in another directory.
  testing::TempDir other;
  const std::string binary = other.Child("hicached");
  {
    std::ifstream in(testing::DaemonPath(), std::ios::binary);
    std::ofstream out(binary, std::ios::binary);
    out << in.rdbuf();
    ASSERT_TRUE(in.good() || in.eof());
    ASSERT_TRUE(out.good());
  }
  ASSERT_EQ(chmod(binary.c_str(), 0755), 0);
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp), binary));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.recovered()) << p.DebugString();
  EXPECT_EQ(p.nodes_recovered(), 3) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum() + p.dropped_orphan() + p.dropped_conflict(),
            0);
  // hicachectl reports it too.
  auto ctl = testing::Run(
      {testing::CtlPath(), "--socket=" + socket_, "--json", "stats"});
  ASSERT_TRUE(ctl.ok()) << ctl.status();
  ASSERT_EQ(ctl->exit_code, 0) << ctl->err;
  const nlohmann::json doc = nlohmann::json::parse(ctl->out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << ctl->out;
  const nlohmann::json& persistence = doc["cache"]["persistence"];
  EXPECT_EQ(persistence.value("recovered", false), true) << ctl->out;
  const nlohmann::json& nodes = persistence.contains("nodes_recovered")
                                    ? persistence["nodes_recovered"]
                                    : persistence["nodesRecovered"];
  EXPECT_TRUE(nodes == 3 || nodes == "3") << ctl->out;
  EXPECT_EQ(HostHit(a_ext), static_cast<int64_t>(a_ext.size()));
  EXPECT_EQ(HostHit(b), static_cast<int64_t>(b.size()));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(a_ext));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(b));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

TEST_F(HotRestartTest, CorruptedChildPageKeepsItsParent) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 3);
  const std::vector<int32_t> a_ext = Concat(a, Tokens(3000, 3));
  ASSERT_NE(Request(a), 0u);
  const uint64_t child = Request(a_ext);
  ASSERT_NE(child, 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(2));
  v1::NodeInfo info;
  ASSERT_NO_FATAL_FAILURE(Inspect(child, &info));
  ASSERT_EQ(info.host_pages_by_rank_size(), static_cast<int>(cp));
  // The child's last page, on the rank that holds it.
  uint32_t rank = cp - 1;
  while (rank > 0 && info.host_pages_by_rank(rank).pages_size() == 0) --rank;
  ASSERT_GT(info.host_pages_by_rank(rank).pages_size(), 0);
  const int64_t host_page = *info.host_pages_by_rank(rank).pages().rbegin();
  const std::string segment = ShmPath(layout_.ranks(rank).host().name());
  const v1::BlockAddress& block = layout_.host_blocks(0);
  const uint64_t offset = block.offset() + host_page * block.page_stride();
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  {
    const int fd = open(segment.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << segment;
    uint8_t byte = 0;
    ASSERT_EQ(pread(fd, &byte, 1, offset), 1);
    byte ^= 0x01;
    ASSERT_EQ(pwrite(fd, &byte, 1, offset), 1);
    close(fd);
  }
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_EQ(p.nodes_recovered(), 1) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum(), 1) << p.DebugString();
  EXPECT_EQ(HostHit(a_ext), static_cast<int64_t>(a.size()));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(a));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// The journal records no tokens: a node's key is read back from its pages'
// key slots (/<prefix>-keys-r<rank>-g<fp>) and verified with the KV bytes.
// A token changed in a slot while the daemon is down drops that node (and
// its child): it is served neither under its real key nor under the one the
// slot now spells.
TEST_F(HotRestartTest, CorruptedKeySlotDropsItsNode) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 3);
  const std::vector<int32_t> a_ext = Concat(a, Tokens(3000, 2));
  const std::vector<int32_t> c = Tokens(2000, 3);
  const uint64_t node_a = Request(a);
  ASSERT_NE(node_a, 0u);
  ASSERT_NE(Request(a_ext), 0u);
  ASSERT_NE(Request(c), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(3));
  v1::NodeInfo info;
  ASSERT_NO_FATAL_FAILURE(Inspect(node_a, &info));
  // A's first page is on the rank its first owner names.
  ASSERT_GT(info.page_owners_size(), 0) << info.DebugString();
  const uint32_t rank = info.page_owners(0);
  ASSERT_GT(info.host_pages_by_rank(rank).pages_size(), 0);
  const int64_t host_page = info.host_pages_by_rank(rank).pages(0);
  std::string keys = layout_.ranks(rank).host().name();
  const size_t at = keys.rfind("-host-r");
  ASSERT_NE(at, std::string::npos) << keys;
  keys.replace(at, 7, "-keys-r");
  const std::string segment = ShmPath(keys);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  std::vector<int32_t> spelled = a;
  {
    // Token 1 of that page's slot.
    const off_t offset = (host_page * page_size_ + 1) * sizeof(int32_t);
    const int fd = open(segment.c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << segment;
    int32_t token = 0;
    ASSERT_EQ(pread(fd, &token, sizeof(token), offset), sizeof(token));
    ASSERT_EQ(token, a[1]);
    token = 424242;
    spelled[1] = token;
    ASSERT_EQ(pwrite(fd, &token, sizeof(token), offset), sizeof(token));
    close(fd);
  }
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_TRUE(p.recovered()) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum(), 1) << p.DebugString();
  EXPECT_EQ(p.nodes_recovered(), 1) << p.DebugString();  // c only.
  EXPECT_EQ(HostHit(a), 0);
  EXPECT_EQ(HostHit(a_ext), 0);
  EXPECT_EQ(HostHit(spelled), 0);
  EXPECT_EQ(HostHit(c), static_cast<int64_t>(c.size()));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(c));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// A host copy dropped before the kill (operator eviction of both tiers)
// stays dropped, even though its pages were reused by a later node whose
// Put is in the journal too.
TEST_F(HotRestartTest, HostEvictedNodeIsNotResurrectedAfterPageReuse) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  const std::vector<int32_t> b = Tokens(2000, 4);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  {
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    for (uint32_t r = 0; r < cp; ++r) {
      evict.add_device_pages_per_lane(1 << 20);
      evict.add_host_pages_per_rank(1 << 20);
    }
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub_->Evict(&ctx, evict, &evicted).ok());
    ASSERT_GT(evicted.host_pages_freed(), 0);
  }
  EXPECT_EQ(HostHit(a), 0);
  ASSERT_NE(Request(b), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(2));
  EXPECT_EQ(Stats().persistence().journal_live(), 1);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_EQ(p.nodes_recovered(), 1) << p.DebugString();
  EXPECT_EQ(HostHit(a), 0);
  EXPECT_EQ(HostHit(b), static_cast<int64_t>(b.size()));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(b));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// A request that diverges inside a committed node splits it (a Split
// record): after the kill the head, the old tail and the new branch all
// come back, byte-exact.
TEST_F(HotRestartTest, SplitHostNodeComesBackAsBothHalves) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  const std::vector<int32_t> head(a.begin(), a.begin() + 2 * kPageSize);
  const std::vector<int32_t> b = Concat(head, Tokens(9000, 2));
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NE(Request(b), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(2));
  EXPECT_EQ(Stats().nodes(), 3);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_EQ(p.nodes_recovered(), 3) << p.DebugString();
  EXPECT_EQ(p.dropped_checksum() + p.dropped_orphan() + p.dropped_conflict(),
            0);
  EXPECT_EQ(HostHit(a), static_cast<int64_t>(a.size()));
  EXPECT_EQ(HostHit(b), static_cast<int64_t>(b.size()));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(a));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(b));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// Every other field of the host geometry: a change is a cold start that
// removes the old segments, as a page-size change is.
TEST_F(HotRestartTest, HostPagesLayoutOrPresetChangeStartsCold) {
  const uint32_t cp = 2;
  const std::vector<int32_t> a = Tokens(1000, 4);
  const std::vector<std::vector<std::string>> changes = {
      WithFlag(Flags(cp), "--host_pages_per_rank", "128"),
      WithFlag(Flags(cp), "--host_layout", "page_first"),
      WithFlag(Flags(cp), "--kv_preset", "micro")};
  std::vector<std::string> previous = Flags(cp);
  for (const std::vector<std::string>& flags : changes) {
    ASSERT_NO_FATAL_FAILURE(Start(previous));
    ASSERT_NE(Request(a), 0u);
    ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
    ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
    const std::vector<std::string> old_segments = HostSegments();
    ASSERT_EQ(old_segments.size(), cp);
    ASSERT_NO_FATAL_FAILURE(Start(flags));
    const v1::HostTierPersistence p = Stats().persistence();
    EXPECT_FALSE(p.recovered()) << flags.back() << p.DebugString();
    EXPECT_EQ(p.nodes_recovered(), 0);
    EXPECT_THAT(daemon_->Stderr(), HasSubstr("host tier: starting cold"));
    for (const std::string& name : old_segments) {
      EXPECT_LT(FileSize(ShmPath(name)), 0) << name << " was kept";
    }
    EXPECT_EQ(HostSegments().size(), cp);
    EXPECT_EQ(HostHit(a), 0) << flags.back();
    ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
    previous = flags;
  }
}

// A start without --state_dir removes the host pools a hot-restart daemon
// of its instance kept; the next hot-restart start is then cold.
TEST_F(HotRestartTest, StartWithoutStateDirRemovesKeptHostPools) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  const std::vector<std::string> kept = HostSegments();
  ASSERT_EQ(kept.size(), cp);
  ASSERT_NO_FATAL_FAILURE(Start(WithFlag(Flags(cp), "--state_dir", "")));
  EXPECT_FALSE(Stats().persistence().enabled());
  for (const std::string& name : kept) {
    EXPECT_LT(FileSize(ShmPath(name)), 0) << name << " was kept";
  }
  EXPECT_EQ(HostHit(a), 0);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_FALSE(p.recovered()) << p.DebugString();
  EXPECT_EQ(HostHit(a), 0);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// A journal overwritten with garbage (or another instance's) is refused:
// a cold start that says why, and the daemon serves and journals again.
TEST_F(HotRestartTest, GarbageJournalIsAColdStartThatServes) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  const std::string journal = state_dir_ + "/journal";
  const int64_t size = FileSize(journal);
  ASSERT_GT(size, 0);
  {
    std::string garbage(size, '\0');
    for (int64_t i = 0; i < size; ++i) garbage[i] = static_cast<char>(i * 37);
    std::ofstream out(journal, std::ios::binary | std::ios::trunc);
    out << garbage;
    ASSERT_TRUE(out.good());
  }
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_FALSE(p.recovered()) << p.DebugString();
  EXPECT_THAT(p.cold_reason(), HasSubstr("journal")) << p.DebugString();
  EXPECT_THAT(daemon_->Stderr(), HasSubstr("host tier: starting cold"));
  EXPECT_EQ(HostHit(a), 0);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NO_FATAL_FAILURE(WaitJournal(1));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  EXPECT_EQ(Stats().persistence().nodes_recovered(), 1);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(a));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// SIGTERM while a backup is in flight (the client keeps its stream and
// channel open): the daemon rolls it back and journals only what committed.
// A restarted daemon rewrites the journal before it serves, so a SIGKILL
// right after it answers loses nothing either.
TEST_F(HotRestartTest, SigtermWithABackupInFlightThenKillRightAfterStart) {
  const uint32_t cp = 2;
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const std::vector<int32_t> a = Tokens(1000, 4);
  const std::vector<int32_t> q = Tokens(5000, 3);
  ASSERT_NE(Request(a), 0u);
  ASSERT_NE(Request(q, 1), 0u);
  EXPECT_EQ(Stats().pending_backups(), 1);
  ASSERT_TRUE(daemon_->Signal(SIGTERM).ok());
  auto exited = daemon_->Wait(absl::Seconds(15));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(*exited, 0) << daemon_->Stderr();
  Disconnect();

  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  EXPECT_EQ(Stats().persistence().nodes_recovered(), 1);
  ASSERT_NO_FATAL_FAILURE(Stop(SIGKILL, 128 + SIGKILL));  // At once.
  ASSERT_NO_FATAL_FAILURE(Start(Flags(cp)));
  const v1::HostTierPersistence p = Stats().persistence();
  EXPECT_EQ(p.nodes_recovered(), 1) << p.DebugString();
  EXPECT_EQ(HostHit(a), static_cast<int64_t>(a.size()));
  EXPECT_EQ(HostHit(q), 0);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(a));
  ASSERT_NO_FATAL_FAILURE(Stop(SIGTERM, 0));
}

// Reproduction (fixed): with a client's channel merely open (no call in
// flight), SIGTERM took the whole --shutdown_grace_seconds (5 s), as gRPC's
// shutdown waits for every connection to close; a planned restart or upgrade,
// where schedulers stay connected, always waited out the grace. The daemon
// now shuts its connections down once no call is left.
TEST_F(HotRestartTest, SigtermWithAnIdleClientChannelIsPrompt) {
  ASSERT_NO_FATAL_FAILURE(Start(Flags(1)));
  ASSERT_TRUE(session_->Close().ok());
  EXPECT_TRUE(backups_->Close().ok());
  Disconnect();  // stub_ (its channel, connected and idle) stays.
  const absl::Time start = absl::Now();
  ASSERT_TRUE(daemon_->Signal(SIGTERM).ok());
  auto exited = daemon_->Wait(absl::Seconds(15));
  ASSERT_TRUE(exited.ok());
  EXPECT_EQ(*exited, 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace hicache::hot_restart
