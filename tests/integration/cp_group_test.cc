// CP groups across daemons with real processes (issue 13, docs/cp-groups.md):
// hicached processes on localhost form a group over Gloo TCP, this test is
// the scheduler on the leader, and one kv_agent worker process per rank maps
// that rank's device pool through the daemon that holds it (the leader or a
// follower), writes the KV of its pages and later verifies every byte that
// load-back brought back.
//
// - Integrity: C = 4 split 2 + 2 and 1 + 3, C = 8 split 4 + 4, C = 4 split
//   1 + 1 + 1 + 1 (four processes): allocate with zigzag owners, write,
//   back up layer by layer (the scheduler's layer_stored acks every rank),
//   insert, commit, evict from the device, load back, verify every byte on
//   every rank. Followers refuse tree RPCs (MatchPrefix, a scheduler's
//   OpenSession) with FAILED_PRECONDITION and the leader's target in the
//   `hicache-leader` trailer; hicachectl stats on a follower names it.
// - A follower SIGKILLed mid-backup and mid-load (held stopped with SIGSTOP
//   first, so that its copies are certainly outstanding), then once more
//   with a load racing the kill: no wrong byte, the backup never commits,
//   the leader degraded with the member dead and a reason, tree RPCs still
//   answered, loads miss with lane_unavailable, backups skip, hicachectl
//   shows the group; restarted with the same ranks it is readmitted, the
//   group formed, and a new round trip is byte-exact on every rank.
// - The leader SIGKILLed: every follower exits non-zero within a bound,
//   with a log line saying it lost the leader.
// - A follower whose geometry or ranks do not fit is refused, named.
//
// The detection and recovery times seen are printed and recorded as test
// properties (follower_kill_to_degraded_ms, follower_restart_to_formed_ms,
// leader_kill_to_follower_exit_ms).
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/cp_group_fixture.h"
#include "tests/testing/binaries.h"
#include "tests/testing/subprocess.h"

namespace hicache {
namespace {

using cp_group_testing::CpGroup;
using cp_group_testing::GroupSpec;
using testing::Subprocess;

constexpr char kLeaderTrailer[] = "hicache-leader";

GroupSpec Spec(uint32_t cp, std::vector<std::vector<uint32_t>> ranks) {
  GroupSpec spec;
  spec.cp_size = cp;
  spec.ranks = std::move(ranks);
  return spec;
}

// One request the scheduler caches: its tokens, the pages its KV was
// written into, and the seed of the workers' pattern.
struct Key {
  std::vector<int32_t> tokens;
  std::vector<int64_t> pages;
  uint32_t seed = 0;
};

std::vector<int32_t> Tokens(int32_t base, size_t n) {
  std::vector<int32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = base + static_cast<int32_t>(i);
  return tokens;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

class CpGroupTest : public ::testing::Test {
 protected:
  ~CpGroupTest() override {
    if (backups_ != nullptr) backups_->Cancel();
    backups_.reset();
    session_.reset();
  }

  // Starts the group and opens the scheduler's session on the leader.
  void StartGroup(GroupSpec spec) {
    group_ = std::make_unique<CpGroup>(std::move(spec));
    const absl::Time start = absl::Now();
    const absl::Status started = group_->Start();
    ASSERT_TRUE(started.ok()) << started << group_->DescribeLogs();
    std::printf("[cp_group] %s formed %.0f ms after the leader's start\n",
                cp_group_testing::SplitLabel(group_->spec()).c_str(),
                Ms(absl::Now() - start));
    ASSERT_NO_FATAL_FAILURE(OpenScheduler());
  }

  void OpenScheduler() {
    if (backups_ != nullptr) backups_->Cancel();
    backups_.reset();
    session_.reset();
    auto session = client::Session::Open(group_->stub(0), "scheduler",
                                         v1::ROLE_SCHEDULER, 0, "");
    ASSERT_TRUE(session.ok()) << session.status() << group_->DescribeLogs();
    session_ = *std::move(session);
    auto layout = session_->GetLayout();
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *layout;
    ASSERT_EQ(layout_.geometry().cp_size(), cp());
    ASSERT_GT(layout_.num_steps(), 1u);
    auto stream = session_->OpenBackupStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    backups_ = *std::move(stream);
  }

  uint32_t cp() const { return group_->spec().cp_size; }
  uint32_t page_size() const { return group_->spec().page_size; }

  // Runs one kv_agent per rank in `ranks` (every rank when empty), each on
  // the socket of the daemon that holds its rank, and expects all to pass.
  void RunWorkers(const std::string& mode, const std::vector<int64_t>& pages,
                  uint32_t seed, std::vector<uint32_t> ranks = {}) {
    if (ranks.empty()) {
      for (uint32_t r = 0; r < cp(); ++r) ranks.push_back(r);
    }
    std::vector<Subprocess> workers;
    for (uint32_t r : ranks) {
      const size_t member = group_->MemberOfRank(r);
      ASSERT_LT(member, group_->size()) << "rank " << r;
      auto worker = Subprocess::Start(
          {testing::RunfilePath("tests/integration/kv_agent"),
           "--socket=" + group_->socket(member), "--mode=" + mode,
           absl::StrCat("--rank=", r), absl::StrCat("--seed=", seed),
           "--pages=" + absl::StrJoin(pages, ",")});
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers.push_back(*std::move(worker));
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      auto code = workers[i].Wait(absl::Seconds(60));
      ASSERT_TRUE(code.ok()) << code.status();
      EXPECT_EQ(*code, 0) << mode << " rank " << ranks[i] << ": "
                          << workers[i].Stderr() << group_->DescribeLogs(10);
    }
  }

  // `n` pages with zigzag owners, or exactly `owners` when given.
  std::vector<int64_t> Allocate(int n, const std::vector<uint32_t>& owners = {}) {
    v1::AllocateItem item;
    item.set_num_pages(n);
    if (owners.empty()) {
      item.set_mode(v1::COMPUTE_OWNER_MODE_ZIGZAG);
    } else {
      item.mutable_owners()->Add(owners.begin(), owners.end());
    }
    auto allocation = session_->Allocate({item});
    EXPECT_TRUE(allocation.ok()) << allocation.status();
    if (!allocation.ok()) return {};
    const auto& pages = allocation->allocations(0).pages();
    return std::vector<int64_t>(pages.begin(), pages.end());
  }

  // Prepares one backup of `key`'s pages; 0 when the daemon skipped it.
  uint64_t Prepare(const Key& key) {
    v1::BackupSpec spec;
    spec.mutable_pages()->Add(key.pages.begin(), key.pages.end());
    spec.set_logical_tokens(static_cast<int64_t>(key.tokens.size()));
    auto ids = backups_->Prepare({spec});
    EXPECT_TRUE(ids.ok()) << ids.status();
    if (!ids.ok() || ids->size() != 1) return 0;
    return (*ids)[0];
  }

  void StoreLayers(uint64_t backup, uint32_t from, uint32_t to) {
    for (uint32_t step = from; step < to; ++step) {
      ASSERT_TRUE(backups_->LayerStored({backup}, step).ok());
    }
  }

  // Inserts `key` with `backup` attached; returns the node.
  uint64_t Insert(const Key& key, uint64_t backup) {
    v1::InsertRequest insert;
    v1::InsertItem* item = insert.add_items();
    item->set_tokens(client::PackTokens(key.tokens));
    item->mutable_pages()->Add(key.pages.begin(), key.pages.end());
    item->set_backup_id(backup);
    auto inserted = session_->Insert(insert);
    EXPECT_TRUE(inserted.ok()) << inserted.status();
    if (!inserted.ok()) return 0;
    EXPECT_EQ(inserted->results(0).cached_tokens(),
              static_cast<int64_t>(key.tokens.size()));
    EXPECT_EQ(inserted->results(0).backup_attached(), backup != 0);
    return inserted->results(0).node();
  }

  // A request of `pages` pages (zigzag, or `owners`) whose KV the workers
  // write, backed up layer by layer, cached and committed to the host tier.
  Key WriteAndCommit(int32_t base, int pages, uint32_t seed,
                     const std::vector<uint32_t>& owners = {}) {
    Key key{Tokens(base, static_cast<size_t>(pages) * page_size()), {}, seed};
    key.pages = Allocate(pages, owners);
    EXPECT_EQ(key.pages.size(), static_cast<size_t>(pages));
    std::vector<uint32_t> ranks = owners;
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    RunWorkers("write", key.pages, seed, ranks);
    const uint64_t backup = Prepare(key);
    if (backup == 0) {
      // Skipped: a lane is unavailable or a page tainted (allocated while
      // the lanes were down). Waiting for its commit would hang.
      ADD_FAILURE() << "backup skipped" << group_->DescribeLogs(10);
      return key;
    }
    StoreLayers(backup, 0, layout_.num_steps());
    Insert(key, backup);
    auto committed = backups_->WaitCommitted(backup);
    EXPECT_TRUE(committed.ok()) << committed.status() << group_->DescribeLogs();
    // Every rank acknowledged every layer: local and remote copies alike.
    EXPECT_EQ(backups_->Progress(backup).steps_done,
              static_cast<int>(cp() * layout_.num_steps()));
    return key;
  }

  // Evicts every unlocked device page (nodes with a host copy move there).
  void EvictDevice() {
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    for (uint32_t r = 0; r < cp(); ++r) {
      evict.add_device_pages_per_lane(int64_t{1} << 40);
    }
    v1::EvictResponse evicted;
    const grpc::Status status = group_->stub(0)->Evict(&ctx, evict, &evicted);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  // MatchPrefix (peek) of `tokens` on the leader.
  v1::MatchResult Peek(const std::vector<int32_t>& tokens) {
    client::MatchOptions options;
    options.peek = true;
    auto match = session_->MatchPrefix({tokens}, options);
    EXPECT_TRUE(match.ok()) << match.status();
    if (!match.ok() || match->results_size() != 1) return {};
    return match->results(0);
  }

  // Loads `key` back (it must be host-only: evicted) and has the workers of
  // `ranks` (every rank when empty) verify every byte; unlocks.
  void LoadAndVerify(const Key& key, std::vector<uint32_t> ranks = {}) {
    ASSERT_EQ(Peek(key.tokens).host_hit_tokens(),
              static_cast<int64_t>(key.tokens.size()));
    auto loaded = session_->LoadBack(key.tokens);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_EQ(loaded->started.loaded_tokens(),
              static_cast<int64_t>(key.tokens.size()))
        << loaded->started.ShortDebugString();
    ASSERT_TRUE(loaded->ok()) << loaded->done.ShortDebugString()
                              << group_->DescribeLogs(10);
    if (ranks.empty()) {
      // One layer_loaded per rank and layer, remote ranks' included.
      EXPECT_EQ(loaded->layers_loaded,
                static_cast<int>(cp() * layout_.num_steps()));
    }
    const auto& proto = loaded->started.locations().pages();
    const std::vector<int64_t> pages(proto.begin(), proto.end());
    ASSERT_EQ(pages.size(), key.pages.size());
    // Same owner lanes, new pages: each worker checks its own.
    for (size_t i = 0; i < pages.size(); ++i) {
      EXPECT_EQ(pages[i] % cp(), key.pages[i] % cp()) << "page " << i;
    }
    RunWorkers("verify", pages, key.seed, ranks);
    ASSERT_TRUE(session_->UnlockHandles({loaded->lock_handle()}).ok());
  }

  // The fixture's index of the member called `name` (size() if none).
  size_t MemberNamed(const std::string& name) const {
    for (size_t i = 0; i < group_->size(); ++i) {
      if (group_->member_name(i) == name) return i;
    }
    return group_->size();
  }

  // The ranks of `member`.
  std::vector<uint32_t> RanksOf(size_t member) const {
    return group_->spec().ranks[member];
  }

  v1::CacheStats LeaderStats() {
    grpc::ClientContext ctx;
    v1::CacheStats stats;
    const grpc::Status status =
        group_->stub(0)->Stats(&ctx, v1::GetStatsRequest(), &stats);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return stats;
  }

  // The group as the leader sees it: every member live with its ranks.
  void ExpectLeaderSeesEveryMemberLive(const v1::CpGroupStatus& g) {
    EXPECT_EQ(g.role(), "leader");
    EXPECT_EQ(g.name(), group_->spec().name);
    EXPECT_EQ(g.cp_size(), cp());
    EXPECT_EQ(g.leader_address(), group_->leader_target());
    ASSERT_EQ(g.members_size(), static_cast<int>(group_->size()))
        << g.ShortDebugString();
    // Member 0 is the leader; followers are numbered in admission order,
    // which is not the order they were started in: find each by name.
    std::vector<bool> seen(group_->size(), false);
    for (const v1::CpGroupMember& m : g.members()) {
      EXPECT_EQ(m.health(), "live") << m.ShortDebugString();
      const size_t member = MemberNamed(m.name());
      ASSERT_LT(member, group_->size()) << m.ShortDebugString();
      EXPECT_EQ(m.index() == 0, member == 0) << m.ShortDebugString();
      EXPECT_FALSE(seen[member]) << "listed twice: " << m.ShortDebugString();
      seen[member] = true;
      EXPECT_EQ(std::vector<uint32_t>(m.ranks().begin(), m.ranks().end()),
                RanksOf(member))
          << m.ShortDebugString();
    }
  }

  // Follower `member` refuses tree RPCs (as a scheduler would make them)
  // with FAILED_PRECONDITION and the leader's target in the trailer.
  void ExpectRedirect(size_t member) {
    {
      grpc::ClientContext ctx;
      v1::MatchPrefixRequest request;
      request.add_items()->set_tokens(client::PackTokens(Tokens(1, 8)));
      v1::MatchPrefixResponse response;
      const grpc::Status status =
          group_->stub(member)->MatchPrefix(&ctx, request, &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << status.error_message();
      EXPECT_TRUE(absl::StrContains(status.error_message(),
                                    group_->leader_target()))
          << status.error_message();
      const auto& trailers = ctx.GetServerTrailingMetadata();
      auto it = trailers.find(kLeaderTrailer);
      ASSERT_NE(it, trailers.end()) << "no " << kLeaderTrailer << " trailer";
      EXPECT_EQ(std::string(it->second.data(), it->second.size()),
                group_->leader_target());
    }
    {
      // A scheduler's session is refused the same way.
      grpc::ClientContext ctx;
      v1::OpenSessionRequest request;
      request.set_client_name("lost scheduler");
      request.set_role(v1::ROLE_SCHEDULER);
      v1::OpenSessionResponse response;
      const grpc::Status status =
          group_->stub(member)->OpenSession(&ctx, request, &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
          << status.error_message();
      const auto& trailers = ctx.GetServerTrailingMetadata();
      auto it = trailers.find(kLeaderTrailer);
      ASSERT_NE(it, trailers.end()) << "no " << kLeaderTrailer << " trailer";
      EXPECT_EQ(std::string(it->second.data(), it->second.size()),
                group_->leader_target());
    }
    {
      // hicachectl on the follower shows the group and names the leader.
      auto ctl = testing::Run(
          {testing::CtlPath(), "stats", "--socket=" + group_->socket(member)});
      ASSERT_TRUE(ctl.ok()) << ctl.status();
      EXPECT_EQ(ctl->exit_code, 0) << ctl->err;
      EXPECT_TRUE(absl::StrContains(ctl->out, "CP group:")) << ctl->out;
      EXPECT_TRUE(absl::StrContains(ctl->out, "follower")) << ctl->out;
      EXPECT_TRUE(absl::StrContains(ctl->out, group_->leader_target()))
          << ctl->out;
    }
  }

  // Every member's log lines that contain `needle`.
  std::string GrepLogs(absl::string_view needle) const {
    std::string out;
    for (size_t m = 0; m < group_->size(); ++m) {
      for (absl::string_view line :
           absl::StrSplit(group_->Log(m), '\n')) {
        if (absl::StrContains(line, needle)) {
          absl::StrAppend(&out, group_->member_name(m), ": ", line, "\n");
        }
      }
    }
    return out;
  }

  // No sanitizer report in any member's log (the daemons are built with
  // the test's --config).
  void ExpectNoSanitizerReport() {
    for (size_t m = 0; m < group_->size(); ++m) {
      const std::string log = group_->Log(m);
      EXPECT_FALSE(absl::StrContains(log, "Sanitizer"))
          << group_->member_name(m) << ":\n" << log;
    }
  }

  // Ends the test's streams and session, stops every follower (it says Bye:
  // the leader counts a death) and then the leader with SIGTERM; each must
  // exit 0 (under a sanitizer: no leak, no report).
  void StopGroupCleanly() {
    if (backups_ != nullptr) EXPECT_TRUE(backups_->Close().ok());
    backups_.reset();
    if (session_ != nullptr) EXPECT_TRUE(session_->Close().ok());
    session_.reset();
    for (size_t m = group_->size(); m-- > 0;) {
      auto code = group_->Stop(m);
      ASSERT_TRUE(code.ok()) << group_->member_name(m) << ": " << code.status()
                             << group_->DescribeLogs();
      EXPECT_EQ(*code, 0) << group_->member_name(m) << ":\n"
                          << group_->Log(m);
    }
    ExpectNoSanitizerReport();
  }

  std::unique_ptr<CpGroup> group_;
  std::unique_ptr<client::Session> session_;
  std::unique_ptr<client::BackupStream> backups_;
  v1::GetLayoutResponse layout_;
};

// --- Integrity ---------------------------------------------------------------

class CpGroupIntegrityTest : public CpGroupTest,
                             public ::testing::WithParamInterface<GroupSpec> {};

TEST_P(CpGroupIntegrityTest, EveryByteRoundTripsThroughTheGroup) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(GetParam()));
  auto leader = group_->GetStats(0);
  ASSERT_TRUE(leader.ok()) << leader.status();
  ASSERT_TRUE(leader->has_cp_group());
  EXPECT_EQ(leader->cp_group().state(), "formed");
  ExpectLeaderSeesEveryMemberLive(leader->cp_group());
  for (size_t m = 1; m < group_->size(); ++m) {
    auto stats = group_->GetStats(m);
    ASSERT_TRUE(stats.ok()) << stats.status();
    const v1::CpGroupStatus& g = stats->cp_group();
    EXPECT_EQ(g.role(), "follower") << g.ShortDebugString();
    EXPECT_EQ(g.state(), "formed") << g.ShortDebugString();
    EXPECT_EQ(g.cp_size(), cp());
    EXPECT_EQ(g.leader_address(), group_->leader_target());
    ASSERT_NO_FATAL_FAILURE(ExpectRedirect(m));
  }

  // Zigzag over every lane, a few pages per lane.
  const Key key = WriteAndCommit(1000, static_cast<int>(2 * cp() + 1), 3);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  EXPECT_EQ(Peek(key.tokens).device().pages_size(), 0);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  // A second request on the same (now freed and reused) physical pages with
  // another pattern: what comes back is this one's, not the first's.
  const Key second = WriteAndCommit(50000, static_cast<int>(2 * cp() + 1), 7);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(second));
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  const v1::CacheStats stats = LeaderStats();
  EXPECT_GE(stats.backups_committed(), 2);
  EXPECT_EQ(stats.backups_rolled_back(), 0);
  EXPECT_EQ(stats.pending_backups(), 0);
  EXPECT_EQ(stats.lanes_size(), static_cast<int>(cp()));
  // Still formed, no death along the way.
  auto after = group_->GetStats(0);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->cp_group().state(), "formed");
  EXPECT_EQ(after->cp_group().deaths(), 0)
      << after->cp_group().ShortDebugString() << "\n"
      << GrepLogs("lost") << group_->DescribeLogs(15);
  ASSERT_NO_FATAL_FAILURE(StopGroupCleanly());
}

INSTANTIATE_TEST_SUITE_P(
    Splits, CpGroupIntegrityTest,
    ::testing::Values(Spec(4, {{0, 1}, {2, 3}}), Spec(4, {{0}, {1, 2, 3}}),
                      Spec(8, {{0, 1, 2, 3}, {4, 5, 6, 7}}),
                      Spec(4, {{0}, {1}, {2}, {3}})),
    [](const ::testing::TestParamInfo<GroupSpec>& info) {
      return cp_group_testing::SplitLabel(info.param);
    });

// --- A follower dies --------------------------------------------------------

TEST_F(CpGroupTest, FollowerKilledMidBackupAndMidLoadThenReadmitted) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0, 1}, {2, 3}})));
  const std::vector<uint32_t> leader_ranks = RanksOf(0);

  // A request whose pages all live on the leader's lanes, and one spread
  // over every lane; both committed and moved to the host tier.
  const Key local = WriteAndCommit(1000, 4, 11, {0, 1, 0, 1});
  const Key spread = WriteAndCommit(20000, 8, 12);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());

  // Mid-backup: the follower is held stopped, so its copies of the layers
  // stored from now on stay outstanding.
  Key doomed{Tokens(30000, 8 * page_size()), {}, 13};
  doomed.pages = Allocate(8);
  ASSERT_NO_FATAL_FAILURE(RunWorkers("write", doomed.pages, doomed.seed));
  const uint64_t backup = Prepare(doomed);
  ASSERT_NE(backup, 0u);
  ASSERT_NO_FATAL_FAILURE(StoreLayers(backup, 0, 1));
  ASSERT_TRUE(group_->Signal(1, SIGSTOP).ok());
  ASSERT_NO_FATAL_FAILURE(StoreLayers(backup, 1, layout_.num_steps()));
  Insert(doomed, backup);

  // Mid-load: the leader's ranks load, the follower's cannot.
  v1::LoadBackRequest load_request;
  load_request.set_tokens(client::PackTokens(spread.tokens));
  auto load = session_->StartLoadBack(load_request);
  ASSERT_TRUE(load.ok()) << load.status();
  v1::LoadBackEvent event;
  ASSERT_TRUE((*load)->Next(&event));
  ASSERT_TRUE(event.has_started()) << event.ShortDebugString();
  const v1::LoadBackEvent::Started started = event.started();
  EXPECT_NE(started.load_id(), 0u) << started.ShortDebugString();

  const absl::Time killed = absl::Now();
  ASSERT_TRUE(group_->Kill(1).ok());
  auto degraded = group_->WaitForState(0, "degraded", absl::Seconds(20));
  ASSERT_TRUE(degraded.ok()) << degraded.status() << group_->DescribeLogs();
  const absl::Duration detect = absl::Now() - killed;

  // The load ends, failed (a miss), or byte-exact on the ranks that live.
  bool load_ok = false;
  while ((*load)->Next(&event)) {
    if (event.has_done()) load_ok = event.done().ok();
  }
  EXPECT_TRUE((*load)->Finish().ok());
  if (load_ok) {
    const auto& proto = started.locations().pages();
    ASSERT_NO_FATAL_FAILURE(
        RunWorkers("verify", std::vector<int64_t>(proto.begin(), proto.end()),
                   spread.seed, leader_ranks));
  }
  // The backup never commits: it is rolled back.
  auto committed = backups_->WaitCommitted(backup);
  EXPECT_FALSE(committed.ok()) << "a backup with a dead rank committed";
  EXPECT_TRUE(backups_->Progress(backup).rolled_back);

  // The leader, consistent and degraded.
  {
    const v1::CpGroupStatus& g = *degraded;
    EXPECT_EQ(g.role(), "leader");
    EXPECT_GE(g.deaths(), 1);
    ASSERT_EQ(g.members_size(), 2) << g.ShortDebugString();
    EXPECT_EQ(g.members(0).health(), "live");
    EXPECT_EQ(g.members(1).name(), group_->member_name(1));
    EXPECT_EQ(g.members(1).health(), "dead");
    EXPECT_FALSE(g.members(1).reason().empty()) << g.ShortDebugString();
    std::printf("[cp_group] follower death as the leader reports it: %s\n",
                g.members(1).reason().c_str());
  }
  // Tree RPCs still answer. Everything with a page on the dead lanes is
  // gone; the leader-only request is still a host hit but cannot load
  // while a lane is down.
  //
  // The leader reports the member dead (and the group degraded) at once,
  // and drops its lanes a moment later on its own thread
  // (docs/cp-groups.md, GroupLeader "Death"): until then a match can still
  // return pages on the dead lanes. Wait (bounded) for the drop, and say
  // how long the window was.
  {
    const absl::Time since = absl::Now();
    const absl::Time deadline = since + absl::Seconds(10);
    while (absl::Now() < deadline &&
           (Peek(spread.tokens).host_hit_tokens() != 0 ||
            Peek(doomed.tokens).device().pages_size() != 0)) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    std::printf(
        "[cp_group] lanes dropped %.1f ms after the leader first reported "
        "'degraded' (0: already dropped)\n",
        Ms(absl::Now() - since));
  }
  EXPECT_EQ(Peek(spread.tokens).host_hit_tokens(), 0);
  EXPECT_EQ(Peek(spread.tokens).device().pages_size(), 0);
  EXPECT_EQ(Peek(doomed.tokens).host_hit_tokens(), 0);
  EXPECT_EQ(Peek(doomed.tokens).device().pages_size(), 0);
  EXPECT_EQ(Peek(local.tokens).host_hit_tokens(),
            static_cast<int64_t>(local.tokens.size()));
  {
    auto miss = session_->LoadBack(local.tokens);
    ASSERT_TRUE(miss.ok()) << miss.status();
    EXPECT_EQ(miss->started.load_id(), 0u);
    EXPECT_EQ(miss->started.miss_reason(), "lane_unavailable");
    if (miss->lock_handle() != 0) {
      EXPECT_TRUE(session_->UnlockHandles({miss->lock_handle()}).ok());
    }
  }
  {
    // Backups skip while degraded.
    Key skipped{Tokens(40000, 4 * page_size()), Allocate(4, {0, 1, 0, 1}), 14};
    EXPECT_EQ(Prepare(skipped), 0u);
    EXPECT_TRUE(session_->Free(skipped.pages).ok());
  }
  {
    const v1::CacheStats stats = LeaderStats();
    EXPECT_EQ(stats.pending_backups(), 0);
    // The two requests before the kill; the doomed backup failed (the
    // engine counts it as failed, which CacheStats does not carry).
    EXPECT_EQ(stats.backups_committed(), 2);
  }
  {
    auto ctl = testing::Run(
        {testing::CtlPath(), "stats", "--socket=" + group_->socket(0)});
    ASSERT_TRUE(ctl.ok()) << ctl.status();
    EXPECT_EQ(ctl->exit_code, 0) << ctl->err;
    EXPECT_TRUE(absl::StrContains(ctl->out, "CP group:")) << ctl->out;
    EXPECT_TRUE(absl::StrContains(ctl->out, "degraded")) << ctl->out;
    EXPECT_TRUE(absl::StrContains(ctl->out, "dead")) << ctl->out;
    EXPECT_TRUE(absl::StrContains(ctl->out, group_->member_name(1)))
        << ctl->out;
  }

  // The follower comes back with the same ranks and fresh pools.
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
  auto formed = group_->WaitFormed();
  ASSERT_TRUE(formed.ok()) << formed.status() << group_->DescribeLogs();
  const absl::Duration recover = absl::Now() - restarted;
  ASSERT_EQ(formed->members_size(), 2) << formed->ShortDebugString();
  EXPECT_EQ(formed->members(1).health(), "live");
  EXPECT_EQ(formed->members(1).readmissions(), 1);

  std::printf(
      "[cp_group] follower SIGKILL -> leader degraded: %.1f ms "
      "(heartbeat %d ms, timeout %d ms); restart -> formed: %.1f ms "
      "(process start included)\n",
      Ms(detect), group_->spec().heartbeat_ms, group_->spec().timeout_ms,
      Ms(recover));
  RecordProperty("follower_kill_to_degraded_ms",
                 static_cast<int>(Ms(detect)));
  RecordProperty("follower_restart_to_formed_ms",
                 static_cast<int>(Ms(recover)));

  // The leader-only request loads again, byte-exact; a new request round
  // trips on every rank, the restarted follower's included.
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(local, leader_ranks));
  const Key fresh = WriteAndCommit(60000, 9, 15);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(fresh));

  // Once more, a load racing a plain SIGKILL: it misses, fails, or is
  // byte-exact on the leader's ranks; never anything else.
  {
    v1::LoadBackRequest request;
    request.set_tokens(client::PackTokens(fresh.tokens));
    ASSERT_NO_FATAL_FAILURE(EvictDevice());
    auto racing = session_->StartLoadBack(request);
    ASSERT_TRUE(racing.ok()) << racing.status();
    const absl::Time killed_again = absl::Now();
    ASSERT_TRUE(group_->Kill(1).ok());
    v1::LoadBackEvent::Started racing_started;
    bool ok = false;
    uint64_t lock = 0;
    while ((*racing)->Next(&event)) {
      if (event.has_started()) racing_started = event.started();
      if (event.has_done()) {
        ok = event.done().ok();
        lock = event.done().lock_handle();
      }
    }
    EXPECT_TRUE((*racing)->Finish().ok());
    if (racing_started.load_id() == 0) {
      // Handled after the death: a miss, either because a lane is down or
      // because the request's host copy was dropped with the dead lanes.
      EXPECT_EQ(racing_started.loaded_tokens(), 0)
          << racing_started.ShortDebugString();
      EXPECT_TRUE(racing_started.miss_reason() == "lane_unavailable" ||
                  racing_started.miss_reason() == "none" ||
                  racing_started.miss_reason().empty())
          << racing_started.ShortDebugString();
    } else if (ok) {
      const auto& proto = racing_started.locations().pages();
      ASSERT_NO_FATAL_FAILURE(RunWorkers(
          "verify", std::vector<int64_t>(proto.begin(), proto.end()),
          fresh.seed, leader_ranks));
    }
    if (lock != 0) {
      EXPECT_TRUE(session_->UnlockHandles({lock}).ok());
    }
    auto again = group_->WaitForState(0, "degraded", absl::Seconds(20));
    ASSERT_TRUE(again.ok()) << again.status() << group_->DescribeLogs();
    const absl::Duration detect_again = absl::Now() - killed_again;
    std::printf("[cp_group] second follower SIGKILL -> degraded: %.1f ms\n",
                Ms(detect_again));
    RecordProperty("follower_kill_to_degraded_ms_2",
                   static_cast<int>(Ms(detect_again)));
    EXPECT_EQ(again->deaths(), 2);
  }
  const absl::Time restarted_again = absl::Now();
  ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
  auto reformed = group_->WaitFormed();
  ASSERT_TRUE(reformed.ok()) << reformed.status() << group_->DescribeLogs();
  std::printf("[cp_group] second restart -> formed: %.1f ms\n",
              Ms(absl::Now() - restarted_again));
  EXPECT_EQ(reformed->members(1).readmissions(), 2);
  const Key last = WriteAndCommit(70000, 8, 16);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(last));
  EXPECT_EQ(LeaderStats().pending_backups(), 0);
  ASSERT_NO_FATAL_FAILURE(StopGroupCleanly());
}

// Detection and recovery times over several rounds, for the record: a
// follower SIGKILLed (its connections reset: detected at the next heartbeat
// the leader cannot send) and a follower stopped with SIGSTOP (silent: only
// the heartbeat timeout finds it); each time restarted with the same ranks.
TEST_F(CpGroupTest, FollowerFailureDetectionAndRecoveryTimes) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0, 1}, {2, 3}})));
  const GroupSpec& spec = group_->spec();
  constexpr int kRounds = 5;
  std::vector<double> detect_ms, recover_ms;
  for (int round = 0; round <= kRounds; ++round) {
    const bool silent = round == kRounds;
    const absl::Time failed = absl::Now();
    ASSERT_TRUE(group_->Signal(1, silent ? SIGSTOP : SIGKILL).ok());
    auto degraded = group_->WaitForState(0, "degraded", absl::Seconds(20));
    ASSERT_TRUE(degraded.ok()) << degraded.status() << group_->DescribeLogs();
    const absl::Duration detect = absl::Now() - failed;
    EXPECT_EQ(degraded->deaths(), round + 1);
    if (silent) {
      // Not before the timeout (less the heartbeat in flight when it
      // stopped), and within it plus slack for a loaded machine.
      EXPECT_GE(detect, absl::Milliseconds(spec.timeout_ms - spec.heartbeat_ms -
                                           10));
      EXPECT_LT(detect, absl::Milliseconds(spec.timeout_ms) + absl::Seconds(10));
      std::printf(
          "[cp_group] silent follower (SIGSTOP) -> degraded: %.1f ms "
          "(timeout %d ms): %s\n",
          Ms(detect), spec.timeout_ms,
          degraded->members(1).reason().c_str());
      RecordProperty("silent_follower_to_degraded_ms",
                     static_cast<int>(Ms(detect)));
    } else {
      detect_ms.push_back(Ms(detect));
    }
    ASSERT_TRUE(group_->Kill(1).ok());
    const absl::Time restarted = absl::Now();
    ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
    auto formed = group_->WaitFormed();
    ASSERT_TRUE(formed.ok()) << formed.status() << group_->DescribeLogs();
    if (!silent) recover_ms.push_back(Ms(absl::Now() - restarted));
    ASSERT_EQ(formed->members_size(), 2);
    EXPECT_EQ(formed->members(1).readmissions(), round + 1);
  }
  // The group works after all that.
  const Key key = WriteAndCommit(1000, 9, 21);
  ASSERT_NO_FATAL_FAILURE(EvictDevice());
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(key));

  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "[cp_group] %d rounds, heartbeat %d ms, timeout %d ms: follower "
      "SIGKILL -> leader degraded median %.1f ms (max %.1f); restart -> "
      "formed median %.1f ms (max %.1f, process start included)\n",
      kRounds, spec.heartbeat_ms, spec.timeout_ms, median(detect_ms),
      *std::max_element(detect_ms.begin(), detect_ms.end()),
      median(recover_ms),
      *std::max_element(recover_ms.begin(), recover_ms.end()));
  RecordProperty("follower_kill_to_degraded_median_ms",
                 static_cast<int>(median(detect_ms)));
  RecordProperty("follower_restart_to_formed_median_ms",
                 static_cast<int>(median(recover_ms)));
}

// --- The leader dies --------------------------------------------------------

TEST_F(CpGroupTest, LeaderKilledEveryFollowerExitsNonZero) {
  ASSERT_NO_FATAL_FAILURE(StartGroup(Spec(4, {{0}, {1}, {2}, {3}})));
  backups_->Cancel();
  backups_.reset();
  session_.reset();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(group_->Kill(0).ok());
  // Bounded: the heartbeat timeout plus generous slack for a loaded CI box.
  const absl::Duration bound =
      absl::Milliseconds(group_->spec().timeout_ms) + absl::Seconds(15);
  absl::Duration slowest;
  for (size_t m = 1; m < group_->size(); ++m) {
    auto code = group_->WaitExit(m, bound - (absl::Now() - killed));
    ASSERT_TRUE(code.ok()) << group_->member_name(m)
                           << " still running: " << code.status()
                           << group_->DescribeLogs();
    slowest = std::max(slowest, absl::Now() - killed);
    EXPECT_NE(*code, 0) << group_->Log(m);
    EXPECT_LT(*code, 128) << "killed by a signal, not an exit: "
                          << group_->Log(m);
    const std::string log = group_->Log(m);
    EXPECT_TRUE(absl::StrContains(log, "lost")) << log;
    EXPECT_TRUE(absl::StrContains(log, "leader")) << log;
    EXPECT_FALSE(absl::StrContains(log, "Sanitizer")) << log;
  }
  std::printf("[cp_group] leader SIGKILL -> every follower exited: %.1f ms\n",
              Ms(slowest));
  RecordProperty("leader_kill_to_follower_exit_ms",
                 static_cast<int>(Ms(slowest)));
}

// --- Refused joins ----------------------------------------------------------

TEST_F(CpGroupTest, MismatchedOrOverlappingFollowerIsRefusedNamingWhy) {
  group_ = std::make_unique<CpGroup>(Spec(4, {{0, 1}, {2, 3}}));
  ASSERT_TRUE(group_->StartLeader().ok()) << group_->DescribeLogs();

  // Another page size: refused for good, naming the field.
  ASSERT_TRUE(group_->LaunchFollower(1, {"--page_size=8"}).ok());
  auto code = group_->WaitExit(1, absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status() << group_->DescribeLogs();
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(absl::StrContains(group_->Log(1), "page_size"))
      << group_->Log(1);

  // Ranks the leader holds: refused, naming the rank.
  ASSERT_TRUE(group_->LaunchFollower(1, {"--ranks=1,2"}).ok());
  code = group_->WaitExit(1, absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status() << group_->DescribeLogs();
  EXPECT_NE(*code, 0);
  EXPECT_TRUE(absl::StrContains(group_->Log(1), "rank 1")) << group_->Log(1);

  // The leader is unharmed and still forming; the right follower forms it.
  auto forming = group_->GetStats(0);
  ASSERT_TRUE(forming.ok()) << forming.status();
  EXPECT_EQ(forming->cp_group().state(), "forming");
  ASSERT_TRUE(group_->StartFollower(1).ok()) << group_->DescribeLogs();
  auto formed = group_->WaitFormed();
  ASSERT_TRUE(formed.ok()) << formed.status() << group_->DescribeLogs();
}

}  // namespace
}  // namespace hicache
