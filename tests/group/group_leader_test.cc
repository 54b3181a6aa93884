// GroupLeader over in-process loopback links: a real HiCacheEngine on the
// leader side (pool_ranks = the leader's ranks; a RoutingTransferEngine
// installed through wrap_transfer) and GroupFollowers whose executors copy
// on a CpuTransferEngine over pools of their own. Forming, refusals, a
// byte-exact backup and load through the group, a member's death (lanes
// unavailable and dropped, loads miss, backups skip, no wrong byte),
// readmission with fresh pools, and a clean Stop.
#include "daemon/group/group_leader.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/group/group_follower.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_pool.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

constexpr uint32_t kP = 4;
constexpr int64_t kDevicePages = 32;
constexpr int64_t kHostPages = 64;
constexpr absl::Duration kInterval = absl::Milliseconds(20);
constexpr absl::Duration kTimeout = absl::Milliseconds(400);
// Slack on top of timeout + interval for a loaded CI machine under TSan.
constexpr absl::Duration kSlack = absl::Seconds(5);

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

struct Split {
  uint32_t cp_size;
  std::vector<Rank> leader;
  std::vector<Rank> follower;
};

// A follower daemon: its own pools for its ranks and a GroupFollower.
struct FollowerSide {
  std::unique_ptr<ShmPoolBackend> backend;
  std::unique_ptr<RankPools> pools;
  std::unique_ptr<GroupFollower> follower;
  std::atomic<int> fatals{0};
  std::promise<absl::Status> fatal;
  std::future<absl::Status> fatal_future = fatal.get_future();

  ~FollowerSide() {
    follower.reset();  // Its copies use the pools.
    pools.reset();
  }
};

class GroupLeaderTest : public ::testing::TestWithParam<Split> {
 protected:
  void SetUp() override {
    const Split& split = GetParam();
    options_ = EngineOptions{.page_size = kP,
                             .cp_size = split.cp_size,
                             .kv_preset = "tiny",
                             .device_pages_per_rank = kDevicePages,
                             .host_pages_per_rank = kHostPages};
    options_.pool_ranks = split.leader;
    EngineOptions engine_options = options_;
    engine_options.wrap_transfer = [this, split](
                                       TransferListener* listener,
                                       const TransferEngineFactory& backend)
        -> std::unique_ptr<TransferEngine> {
      auto routing = std::make_unique<RoutingTransferEngine>(
          listener, backend(listener), split.leader);
      routing_ = routing.get();
      return routing;
    };
    auto engine = HiCacheEngine::Create(engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    ASSERT_NE(routing_, nullptr);
    GroupLeaderOptions leader_options{
        .group_name = "g",
        .cp_size = split.cp_size,
        .geometry = GroupGeometryFrom(options_, engine_->geometry()),
        .heartbeat_interval = kInterval,
        .heartbeat_timeout = kTimeout};
    leader_options.on_member_dead = [this](uint32_t index,
                                           const std::string& reason) {
      const int n = ++deaths_;
      if (n == 1) first_death_.set_value(absl::StrCat(index, ": ", reason));
      std::lock_guard<std::mutex> lock(reasons_mu_);
      reasons_.push_back(reason);
      reasons_cv_.notify_all();
    };
    auto leader =
        GroupLeader::Create(std::move(leader_options), engine_.get(), routing_);
    ASSERT_TRUE(leader.ok()) << leader.status();
    leader_ = *std::move(leader);
  }
  void TearDown() override {
    leader_.reset();  // Before the engine (its routing engine) goes.
    followers_.clear();
    engine_.reset();
  }

  GroupGeometry FollowerGeometry(std::vector<Rank> ranks) const {
    EngineOptions o = options_;
    o.pool_ranks = std::move(ranks);
    return GroupGeometryFrom(o, engine_->geometry());
  }

  // A follower daemon for `ranks` with fresh pools; returns its index in
  // followers_.
  FollowerSide* NewFollower(const std::vector<Rank>& ranks) {
    static std::atomic<int> counter{0};
    auto side = std::make_unique<FollowerSide>();
    side->backend = std::make_unique<ShmPoolBackend>(
        absl::StrCat("/hicache-gl-", getpid(), "-", counter++));
    auto layout = CpLayout::Create(kP, GetParam().cp_size, ranks);
    EXPECT_TRUE(layout.ok());
    auto pools = RankPools::Create(*layout, engine_->geometry(),
                                   {.device_pages_per_rank = kDevicePages,
                                    .host_pages_per_rank = kHostPages,
                                    .host_layout = options_.host_layout},
                                   *side->backend);
    EXPECT_TRUE(pools.ok()) << pools.status();
    side->pools = *std::move(pools);
    const RankPools* raw_pools = side->pools.get();
    FollowerSide* raw = side.get();
    side->follower = std::make_unique<GroupFollower>(
        GroupFollowerOptions{
            .group_name = "g",
            .cp_size = GetParam().cp_size,
            .leader = "leader",
            .scope = {.ranks = ranks,
                      .num_steps = engine_->geometry().NumSteps(),
                      .device_pages_per_rank = kDevicePages,
                      .host_pages_per_rank = kHostPages},
            .heartbeat_interval = kInterval,
            .heartbeat_timeout = kTimeout},
        [raw_pools](TransferListener* listener) {
          return std::make_unique<CpuTransferEngine>(raw_pools, listener, 2);
        },
        [raw](const absl::Status& cause) {
          if (++raw->fatals == 1)
            raw->fatal.set_value(
                absl::Status(cause.code(), std::string(cause.message())));
        });
    followers_.push_back(std::move(side));
    return raw;
  }

  // Admits `side` over a fresh loopback pair; returns the leader's end.
  absl::StatusOr<Admission> Join(FollowerSide* side, const std::string& name,
                                 const std::vector<Rank>& ranks,
                                 comm::LoopbackCommunicator** leader_end) {
    auto [leader_link, follower_link] =
        comm::LoopbackCommunicator::CreatePair("leader", "follower link");
    if (leader_end != nullptr) *leader_end = leader_link.get();
    absl::StatusOr<Admission> admission =
        leader_->Admit(name, FollowerGeometry(ranks), std::move(leader_link));
    if (!admission.ok()) return admission;
    absl::Status ran = side->follower->Run(
        std::move(follower_link), admission->epoch, admission->member_index);
    if (!ran.ok()) return ran;
    return admission;
  }

  bool Local(Rank lane) const {
    const auto& mine = GetParam().leader;
    return std::find(mine.begin(), mine.end(), lane) != mine.end();
  }
  // The device pool holding `page`: the leader's or the follower's.
  char* PageBase(LogicalPage page, const FollowerSide* side) const {
    const Rank lane = engine_->layout().LaneOf(page);
    const KvPool* pool =
        Local(lane) ? engine_->pools().device(lane) : side->pools->device(lane);
    EXPECT_NE(pool, nullptr) << "lane " << lane;
    return static_cast<char*>(pool->host_data());
  }
  // Every block of (family, layer) of `page`, in order.
  template <typename Fn>
  void ForBlocks(LogicalPage page, Fn fn) const {
    const KvGeometry& g = engine_->geometry();
    for (int f = 0; f < static_cast<int>(g.families().size()); ++f) {
      for (uint32_t l = 0; l < g.families()[f].num_layers; ++l) {
        fn(g.DeviceOffset(kDevicePages, engine_->layout().PhysicalPageOf(page),
                          f, l),
           static_cast<size_t>(kP) * g.families()[f].bytes_per_token, f, l);
      }
    }
  }
  static char Pattern(int salt, size_t i, int f, uint32_t l, size_t j) {
    return static_cast<char>(salt * 131 + i * 29 + f * 17 + l * 7 + j);
  }
  void WritePages(const std::vector<LogicalPage>& pages, int salt,
                  const FollowerSide* side) {
    for (size_t i = 0; i < pages.size(); ++i) {
      char* base = PageBase(pages[i], side);
      ForBlocks(pages[i], [&](uint64_t off, size_t n, int f, uint32_t l) {
        for (size_t j = 0; j < n; ++j)
          base[off + j] = Pattern(salt, i, f, l, j);
      });
    }
  }
  // The first wrong byte, or OK.
  absl::Status VerifyPages(const std::vector<LogicalPage>& pages, int salt,
                           const FollowerSide* side) const {
    for (size_t i = 0; i < pages.size(); ++i) {
      const char* base = PageBase(pages[i], side);
      absl::Status bad;
      ForBlocks(pages[i], [&](uint64_t off, size_t n, int f, uint32_t l) {
        for (size_t j = 0; j < n && bad.ok(); ++j) {
          if (base[off + j] != Pattern(salt, i, f, l, j)) {
            bad = absl::DataLossError(absl::StrCat(
                "page ", i, " (lane ", engine_->layout().LaneOf(pages[i]),
                ") family ", f, " layer ", l, " byte ", j));
          }
        }
      });
      if (!bad.ok()) return bad;
    }
    return absl::OkStatus();
  }
  // Scribbles over every device pool (the leader's and `side`'s), so that a
  // load can only be right if it copied from the host tier.
  void ScribbleDevice(const FollowerSide* side) {
    for (Rank r = 0; r < GetParam().cp_size; ++r) {
      const KvPool* pool =
          Local(r) ? engine_->pools().device(r) : side->pools->device(r);
      if (pool == nullptr) continue;
      std::memset(pool->host_data(), 0x5a, pool->size_bytes());
    }
  }

  // Caches `tokens` on pages owned by `owners` with a committed backup.
  void Cache(const std::vector<int32_t>& tokens,
             const std::vector<Rank>& owners, int salt,
             const FollowerSide* side) {
    auto pages = engine_->AllocateWithOwners(owners);
    ASSERT_TRUE(pages.ok()) << pages.status();
    WritePages(*pages, salt, side);
    auto ops = engine_->PrepareBackups(
        {BackupSpec{*pages, static_cast<int64_t>(tokens.size())}});
    ASSERT_TRUE(ops.ok()) << ops.status();
    ASSERT_NE((*ops)[0], 0u);
    for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
      ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
    }
    auto inserted = engine_->Insert("", tokens, *pages);
    ASSERT_TRUE(inserted.ok()) << inserted.status();
    ASSERT_TRUE(inserted->uncached_pages.empty());
    ASSERT_TRUE(engine_->AttachBackup((*ops)[0], inserted->node).ok());
    engine_->WaitForTransfers();
  }
  void EvictAllDevice() {
    std::vector<int64_t> all(GetParam().cp_size, kDevicePages);
    ASSERT_TRUE(engine_->EvictPages(all, {}).ok());
  }
  // Loads `tokens` back (a full host hit expected) and checks every byte.
  void LoadAndVerify(const std::vector<int32_t>& tokens, int salt,
                     const FollowerSide* side) {
    auto load = engine_->LoadBack("", tokens);
    ASSERT_TRUE(load.ok()) << load.status();
    ASSERT_NE(load->op_id, 0u) << "miss " << static_cast<int>(load->miss);
    ASSERT_EQ(load->loaded_len, static_cast<int64_t>(tokens.size()));
    engine_->WaitForTransfers();
    auto done = engine_->LoadDone(load->op_id);
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_TRUE(*done);
    const absl::Status bytes = VerifyPages(load->pages, salt, side);
    EXPECT_TRUE(bytes.ok()) << bytes;
    ASSERT_TRUE(engine_->FinishLoad(load->op_id).ok());
  }
  std::vector<Rank> Zigzag() const {
    // Two pages a lane, alternating.
    std::vector<Rank> owners;
    for (int rep = 0; rep < 2; ++rep) {
      for (Rank r = 0; r < GetParam().cp_size; ++r) owners.push_back(r);
    }
    return owners;
  }
  std::vector<Rank> LeaderOnly(int pages) const {
    return std::vector<Rank>(pages, GetParam().leader.front());
  }

  EngineOptions options_;
  std::unique_ptr<HiCacheEngine> engine_;
  RoutingTransferEngine* routing_ = nullptr;  // Owned by the engine.
  std::unique_ptr<GroupLeader> leader_;
  std::vector<std::unique_ptr<FollowerSide>> followers_;
  std::atomic<int> deaths_{0};
  std::promise<std::string> first_death_;
  std::mutex reasons_mu_;
  std::condition_variable reasons_cv_;
  std::vector<std::string> reasons_;  // Of every death, in order.

  // The reason of the n-th death (1-based); empty if it did not come.
  std::string AwaitDeath(size_t n) {
    std::unique_lock<std::mutex> lock(reasons_mu_);
    if (!reasons_cv_.wait_for(
            lock, absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack),
            [&] { return reasons_.size() >= n; })) {
      return "";
    }
    return reasons_[n - 1];
  }
};

TEST_P(GroupLeaderTest, FormsOnceTheFollowerIsAdmitted) {
  const Split& split = GetParam();
  GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kForming);
  EXPECT_EQ(status.role, GroupRole::kLeader);
  EXPECT_EQ(status.name, "g");
  ASSERT_EQ(status.members.size(), 1u);
  EXPECT_EQ(status.members[0].ranks, split.leader);
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);

  FollowerSide* f = NewFollower(split.follower);
  auto admission = Join(f, "f1", split.follower, nullptr);
  ASSERT_TRUE(admission.ok()) << admission.status();
  EXPECT_EQ(admission->member_index, 1u);
  EXPECT_EQ(admission->epoch, 1u);
  EXPECT_FALSE(admission->readmitted);
  status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  EXPECT_EQ(status.epoch, 1u);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.members[1].name, "f1");
  EXPECT_EQ(status.members[1].ranks, split.follower);
  EXPECT_TRUE(status.members[1].live);
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  EXPECT_EQ(f->follower->Status().state, GroupState::kFormed);
  EXPECT_STREQ(GroupStateName(status.state), "formed");
}

TEST_P(GroupLeaderTest, GeometryMismatchIsRefusedNamingTheField) {
  GroupGeometry bad = FollowerGeometry(GetParam().follower);
  bad.host_pages_per_rank += 1;
  auto [leader_link, follower_link] =
      comm::LoopbackCommunicator::CreatePair("leader", "f1");
  auto admission = leader_->Admit("f1", bad, std::move(leader_link));
  ASSERT_EQ(admission.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(admission.status().message().find("host_pages_per_rank"),
            std::string::npos)
      << admission.status();
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kForming);
  EXPECT_EQ(status.members.size(), 1u);
  EXPECT_EQ(status.epoch, 0u);
  EXPECT_EQ(engine_->UnavailableLanes(), GetParam().follower);
}

TEST_P(GroupLeaderTest, RanksOfALiveMemberOrTheLeaderAreRefused) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  ASSERT_TRUE(Join(f, "f1", split.follower, nullptr).ok());
  // The follower's last rank again: held by live member f1.
  const std::vector<Rank> again = {split.follower.back()};
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "f2");
  auto refused = leader_->Admit("f2", FollowerGeometry(again), std::move(l1));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("f1"), std::string::npos)
      << refused.status();
  // The leader's own rank.
  const std::vector<Rank> mine = {split.leader.front()};
  auto [l2, f2] = comm::LoopbackCommunicator::CreatePair("leader", "f3");
  refused = leader_->Admit("f3", FollowerGeometry(mine), std::move(l2));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("leader"), std::string::npos)
      << refused.status();
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  EXPECT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.epoch, 1u);
}

TEST_P(GroupLeaderTest, BackupAndLoadThroughTheGroupAreByteExact) {
  FollowerSide* f = NewFollower(GetParam().follower);
  ASSERT_TRUE(Join(f, "f1", GetParam().follower, nullptr).ok());
  const std::vector<int32_t> zig = Seq(0, kP * 2 * GetParam().cp_size);
  ASSERT_NO_FATAL_FAILURE(Cache(zig, Zigzag(), 3, f));
  EXPECT_EQ(engine_->Stats().backups_committed, 1);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(f);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(zig, 3, f));
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  EXPECT_GT(f->follower->executor_stats().steps_executed, 0);
  EXPECT_EQ(f->follower->executor_stats().steps_refused, 0);
  EXPECT_EQ(f->fatals.load(), 0);
}

// The follower's link breaks while copies are in flight: the leader declares
// it dead within the bound, once; its lanes are unavailable and dropped
// (loads miss, backups skip, nothing on them is matched); the follower is
// told once. A restarted follower (fresh pools) is readmitted in the same
// slot and the group serves again, byte-exact.
TEST_P(GroupLeaderTest, DeathMidTrafficThenReadmission) {
  const Split& split = GetParam();
  FollowerSide* f = NewFollower(split.follower);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(f, "f1", split.follower, &link).ok());
  const std::vector<int32_t> zig = Seq(0, kP * 2 * split.cp_size);
  const std::vector<int32_t> mine = Seq(1000, kP * 2);
  ASSERT_NO_FATAL_FAILURE(Cache(zig, Zigzag(), 5, f));
  ASSERT_NO_FATAL_FAILURE(Cache(mine, LeaderOnly(2), 6, f));
  ASSERT_EQ(engine_->Stats().backups_committed, 2);
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());  // Both host-only now.

  // Backups in flight when the link breaks.
  auto pages = engine_->AllocateWithOwners(Zigzag());
  ASSERT_TRUE(pages.ok());
  WritePages(*pages, 7, f);
  auto ops = engine_->PrepareBackups(
      {BackupSpec{*pages, static_cast<int64_t>(pages->size() * kP)}});
  ASSERT_TRUE(ops.ok());
  ASSERT_TRUE(engine_->LayerStored(*ops, 0).ok());
  auto first_death = first_death_.get_future();
  const auto broke = std::chrono::steady_clock::now();
  link->Break(absl::UnavailableError("the follower's host went away"));
  for (uint32_t s = 1; s < engine_->geometry().NumSteps(); ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  ASSERT_EQ(first_death.wait_for(
                absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack)),
            std::future_status::ready);
  const absl::Duration took =
      absl::FromChrono(std::chrono::steady_clock::now() - broke);
  const std::string reason = first_death.get();
  std::printf("member declared dead %s after the break: %s\n",
              absl::FormatDuration(took).c_str(), reason.c_str());
  EXPECT_NE(reason.find("f1"), std::string::npos) << reason;
  EXPECT_NE(reason.find("lost"), std::string::npos) << reason;
  // The follower lost its leader, once.
  ASSERT_EQ(f->fatal_future.wait_for(
                absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack)),
            std::future_status::ready);
  const absl::Status fatal = f->fatal_future.get();
  EXPECT_EQ(fatal.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(fatal.message().find("CP group g leader leader lost"),
            std::string::npos)
      << fatal;
  EXPECT_EQ(f->follower->Status().state, GroupState::kDegraded);

  leader_->AwaitDeathsHandled();
  engine_->WaitForTransfers();
  EXPECT_EQ(deaths_.load(), 1);
  GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  EXPECT_EQ(status.deaths, 1);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_FALSE(status.members[1].live);
  EXPECT_NE(status.members[1].reason.find("f1"), std::string::npos);
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  EXPECT_GE(engine_->Stats().lane_drops, 1);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  // The zigzag node had pages on the dead lanes: gone.
  EXPECT_EQ(engine_->Match("", zig, /*peek=*/true)->host_hit_len, 0);
  // A load is a miss, a backup is skipped.
  EngineStats before = engine_->Stats();
  auto load = engine_->LoadBack("", mine);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->op_id, 0u);
  EXPECT_EQ(load->miss, LoadMissReason::kLaneUnavailable);
  if (load->node != kNoNode) {
    ASSERT_TRUE(engine_->Unlock(load->node).ok());
  }
  auto spare = engine_->AllocateWithOwners(LeaderOnly(1));
  ASSERT_TRUE(spare.ok());
  auto skipped = engine_->PrepareBackups({BackupSpec{*spare, kP}});
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ((*skipped)[0], 0u);
  ASSERT_TRUE(engine_->Free(*spare).ok());
  ASSERT_TRUE(engine_->Free(*pages).ok());
  EngineStats after = engine_->Stats();
  EXPECT_EQ(after.load_misses_lane_unavailable,
            before.load_misses_lane_unavailable + 1);
  EXPECT_GT(after.backups_skipped_lane_unavailable,
            before.backups_skipped_lane_unavailable);
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();

  // The follower restarts with fresh pools and rejoins.
  f->follower->Stop();
  FollowerSide* g = NewFollower(split.follower);
  auto again = Join(g, "f1-restarted", split.follower, nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->readmitted);
  EXPECT_EQ(again->member_index, 1u);
  EXPECT_EQ(again->epoch, 2u);
  status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kFormed);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_TRUE(status.members[1].live);
  EXPECT_EQ(status.members[1].readmissions, 1);
  EXPECT_EQ(status.members[1].name, "f1-restarted");
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  // The leader-only node survived (its host copy is on the leader) and loads
  // back byte-exact through the new follower (which acks its empty copies);
  // a new zigzag key round-trips.
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(g);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(mine, 6, g));
  const std::vector<int32_t> zig2 = Seq(5000, kP * 2 * split.cp_size);
  ASSERT_NO_FATAL_FAILURE(Cache(zig2, Zigzag(), 8, g));
  ASSERT_NO_FATAL_FAILURE(EvictAllDevice());
  ScribbleDevice(g);
  ASSERT_NO_FATAL_FAILURE(LoadAndVerify(zig2, 8, g));
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  EXPECT_EQ(deaths_.load(), 1);
  EXPECT_EQ(f->fatals.load(), 1);
  EXPECT_EQ(g->fatals.load(), 0);
}

// A member whose ranks overlap a dead member's only in part is refused;
// exactly the dead member's ranks are readmitted.
TEST_P(GroupLeaderTest, PartialOverlapWithADeadMemberIsRefused) {
  const Split& split = GetParam();
  if (split.follower.size() < 2) GTEST_SKIP() << "needs a 2-rank follower";
  FollowerSide* f = NewFollower(split.follower);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(f, "f1", split.follower, &link).ok());
  auto death = first_death_.get_future();
  link->Break(absl::UnavailableError("gone"));
  ASSERT_EQ(death.wait_for(absl::ToChronoMilliseconds(kTimeout + kSlack)),
            std::future_status::ready);
  const std::vector<Rank> part = {split.follower.front()};
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "f2");
  auto refused = leader_->Admit("f2", FollowerGeometry(part), std::move(l1));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dead member"), std::string::npos)
      << refused.status();
  EXPECT_EQ(leader_->Status().state, GroupState::kDegraded);
}

// A hostile name never puts a newline in a message or a reason.
TEST_P(GroupLeaderTest, MemberNamesAreEscaped) {
  const Split& split = GetParam();
  const std::string evil = "f1\nFATAL forged";
  FollowerSide* f = NewFollower(split.follower);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(f, evil, split.follower, &link).ok());
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "x");
  auto refused =
      leader_->Admit("x", FollowerGeometry(split.follower), std::move(l1));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().message().find('\n'), std::string::npos)
      << refused.status();
  auto death = first_death_.get_future();
  link->Break(absl::UnavailableError("gone"));
  ASSERT_EQ(death.wait_for(absl::ToChronoMilliseconds(kTimeout + kSlack)),
            std::future_status::ready);
  const std::string reason = death.get();
  EXPECT_EQ(reason.find('\n'), std::string::npos) << reason;
  EXPECT_NE(reason.find("f1\\nFATAL forged"), std::string::npos) << reason;
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(leader_->Status().members[1].reason.find('\n'), std::string::npos);
}

// Every way of losing a member is one death that drops its lanes: a
// follower that never answers (silence, not before the timeout), one that
// sends garbage (a protocol error), one that says Bye (its Stop). Each time
// a restarted follower is readmitted.
TEST_P(GroupLeaderTest, EveryWayOfLosingAMemberIsOneDeath) {
  const Split& split = GetParam();
  // Silence: admitted, but the follower's end never starts.
  auto [l1, silent] = comm::LoopbackCommunicator::CreatePair("leader", "f");
  const auto admitted = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      leader_->Admit("silent", FollowerGeometry(split.follower), std::move(l1))
          .ok());
  std::string reason = AwaitDeath(1);
  const absl::Duration took =
      absl::FromChrono(std::chrono::steady_clock::now() - admitted);
  EXPECT_NE(reason.find("nothing heard"), std::string::npos) << reason;
  EXPECT_GE(took, kTimeout);
  EXPECT_LE(took, kTimeout + kInterval + kSlack);
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);

  // A protocol error.
  auto [l2, raw] = comm::LoopbackCommunicator::CreatePair("leader", "f");
  comm::LoopbackCommunicator* garbage = raw.get();
  auto second = leader_->Admit("garbled", FollowerGeometry(split.follower),
                               std::move(l2));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->readmitted);
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  ASSERT_TRUE(
      raw->Start([](absl::string_view) {}, [](const absl::Status&) {}).ok());
  ASSERT_TRUE(garbage->Send("not a frame").ok());
  reason = AwaitDeath(2);
  EXPECT_NE(reason.find("protocol error"), std::string::npos) << reason;
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);

  // Bye: the follower stops.
  FollowerSide* f = NewFollower(split.follower);
  auto third = Join(f, "polite", split.follower, nullptr);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->epoch, 3u);
  EXPECT_EQ(leader_->Status().state, GroupState::kFormed);
  f->follower->Stop();
  reason = AwaitDeath(3);
  EXPECT_NE(reason.find("said bye"), std::string::npos) << reason;
  leader_->AwaitDeathsHandled();
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  EXPECT_EQ(status.deaths, 3);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.members[1].readmissions, 2);
  EXPECT_EQ(deaths_.load(), 3);
  EXPECT_EQ(f->fatals.load(), 0);  // Its own Stop is no loss.
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
}

// The rendezvous failing is returned as is and changes nothing but the
// epoch.
TEST_P(GroupLeaderTest, ConnectFailureChangesNothing) {
  const Split& split = GetParam();
  auto admission = leader_->Admit(
      "f1", FollowerGeometry(split.follower),
      [](const Admission& a)
          -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous of epoch ", a.epoch, " timed out"));
      });
  EXPECT_EQ(admission.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(admission.status().message(), "rendezvous of epoch 1 timed out");
  GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kForming);
  EXPECT_EQ(status.members.size(), 1u);
  EXPECT_EQ(engine_->UnavailableLanes(), split.follower);
  FollowerSide* f = NewFollower(split.follower);
  auto joined = Join(f, "f1", split.follower, nullptr);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->epoch, 2u);
  EXPECT_EQ(joined->member_index, 1u);
  EXPECT_EQ(leader_->Status().state, GroupState::kFormed);
}

// A death is handled while another admission waits in its rendezvous.
TEST_P(GroupLeaderTest, DeathIsHandledDuringAnotherAdmissionsConnect) {
  const Split& split = GetParam();
  if (split.follower.size() < 2) GTEST_SKIP() << "needs two follower ranks";
  const std::vector<Rank> first = {split.follower[0]};
  const std::vector<Rank> second = {split.follower[1]};
  FollowerSide* a = NewFollower(first);
  comm::LoopbackCommunicator* link = nullptr;
  ASSERT_TRUE(Join(a, "a", first, &link).ok());
  EXPECT_EQ(leader_->Status().state, GroupState::kForming);
  auto death = first_death_.get_future();
  FollowerSide* b = NewFollower(second);
  auto [leader_end, follower_end] =
      comm::LoopbackCommunicator::CreatePair("leader", "b");
  auto admission = leader_->Admit(
      "b", FollowerGeometry(second),
      [&](const Admission&)
          -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
        link->Break(absl::UnavailableError("a went away"));
        if (death.wait_for(absl::ToChronoMilliseconds(kTimeout + kSlack)) !=
            std::future_status::ready) {
          return absl::DeadlineExceededError("the death was not handled");
        }
        return std::move(leader_end);
      });
  ASSERT_TRUE(admission.ok()) << admission.status();
  ASSERT_TRUE(b->follower
                  ->Run(std::move(follower_end), admission->epoch,
                        admission->member_index)
                  .ok());
  EXPECT_EQ(admission->member_index, 2u);
  EXPECT_EQ(engine_->UnavailableLanes(), first);
  const GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, GroupState::kDegraded);
  ASSERT_EQ(status.members.size(), 3u);
  EXPECT_FALSE(status.members[1].live);
  EXPECT_TRUE(status.members[2].live);
  EXPECT_EQ(deaths_.load(), 1);
}

TEST_P(GroupLeaderTest, StopWithCopiesInFlightIsClean) {
  FollowerSide* f = NewFollower(GetParam().follower);
  ASSERT_TRUE(Join(f, "f1", GetParam().follower, nullptr).ok());
  auto pages = engine_->AllocateWithOwners(Zigzag());
  ASSERT_TRUE(pages.ok());
  auto ops = engine_->PrepareBackups(
      {BackupSpec{*pages, static_cast<int64_t>(pages->size() * kP)}});
  ASSERT_TRUE(ops.ok());
  for (uint32_t s = 0; s < engine_->geometry().NumSteps(); ++s) {
    ASSERT_TRUE(engine_->LayerStored(*ops, s).ok());
  }
  leader_->Stop();
  leader_->Stop();  // Idempotent.
  EXPECT_EQ(leader_->Status().state, GroupState::kStopped);
  EXPECT_EQ(engine_->UnavailableLanes(), GetParam().follower);
  engine_->WaitForTransfers();
  EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  ASSERT_TRUE(engine_->Free(*pages).ok());
  // The follower hears of it (Bye or the closed link), once.
  ASSERT_EQ(f->fatal_future.wait_for(
                absl::ToChronoMilliseconds(kTimeout + kInterval + kSlack)),
            std::future_status::ready);
  EXPECT_EQ(f->fatal_future.get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(f->fatals.load(), 1);
  // A stopped leader admits no one; Stop is not a death.
  auto [l1, f1] = comm::LoopbackCommunicator::CreatePair("leader", "f2");
  EXPECT_EQ(
      leader_->Admit("f2", FollowerGeometry(GetParam().follower), std::move(l1))
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(deaths_.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Splits, GroupLeaderTest,
                         ::testing::Values(Split{2, {0}, {1}},
                                           Split{4, {0, 1}, {2, 3}}),
                         [](const ::testing::TestParamInfo<Split>& info) {
                           return absl::StrCat(
                               "C", info.param.cp_size, "_leader",
                               info.param.leader.size(), "_follower",
                               info.param.follower.size());
                         });

}  // namespace
}  // namespace hicache::group
