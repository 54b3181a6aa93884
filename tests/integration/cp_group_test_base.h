#pragma once

// The scheduler's side of the multi-process CP group tests
// (cp_group_integrity_test.cc, cp_group_failure_test.cc,
// cp_group_worker_test.cc): a gtest fixture that starts a CpGroup
// (cp_group_fixture.h), opens the scheduler's session and BackupSession
// stream on the leader, and drives one kv_agent worker process per rank on
// the socket of the daemon that holds the rank (the leader or a follower):
// write a request's KV, back it up layer by layer, insert, commit, evict,
// load back and verify every byte.
//
// Header-only: each test target lists it in its srcs. Not thread-safe: one
// test thread drives it.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "tests/integration/cp_group_fixture.h"
#include "tests/testing/binaries.h"
#include "tests/testing/subprocess.h"

namespace hicache::cp_group_testing {

using testing::Subprocess;

inline constexpr char kLeaderTrailer[] = "hicache-leader";

inline GroupSpec Spec(uint32_t cp, std::vector<std::vector<uint32_t>> ranks) {
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

inline std::vector<int32_t> Tokens(int32_t base, size_t n) {
  std::vector<int32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = base + static_cast<int32_t>(i);
  return tokens;
}

inline double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

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
                SplitLabel(group_->spec()).c_str(),
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
    if (backups_ != nullptr) {
      EXPECT_TRUE(backups_->Close().ok());
    }
    backups_.reset();
    if (session_ != nullptr) {
      EXPECT_TRUE(session_->Close().ok());
    }
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

}  // namespace hicache::cp_group_testing
