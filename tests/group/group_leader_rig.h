#pragma once

// The rig of group_leader_test: a real HiCacheEngine on the leader side
// (pool_ranks = the leader's ranks, a RoutingTransferEngine installed
// through wrap_transfer), a GroupLeader over it, and follower daemons
// (GroupFollower + a CpuTransferEngine over shared-memory pools of their
// own) joined over loopback pairs; KV bytes written and checked in
// whichever daemon's pools hold each page.

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
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/group/event_forwarder.h"
#include "daemon/group/group_follower.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/group_leader.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_pool.h"
#include "gtest/gtest.h"

namespace hicache::group::testing {

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
  // Its daemon's EventHub: the leader's worker events land here.
  EventHub hub;
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
    // Worker events across the link: the hub's tap feeds the forwarder.
    engine_->SetListener(&hub_);
    hub_.SetSubscriberTap([this](const OpEvent& event, const std::string& ns) {
      forwarder_.Publish(event, ns);
    });
    GroupLeaderOptions leader_options{
        .group_name = "g",
        .cp_size = split.cp_size,
        .geometry = GroupGeometryFrom(options_, engine_->geometry()),
        .heartbeat_interval = heartbeat_interval_,
        .heartbeat_timeout = heartbeat_timeout_};
    leader_options.on_member_dead = [this](uint32_t index,
                                           const std::string& reason) {
      const int n = ++deaths_;
      if (n == 1) first_death_.set_value(absl::StrCat(index, ": ", reason));
      std::lock_guard<std::mutex> lock(reasons_mu_);
      reasons_.push_back(reason);
      reasons_cv_.notify_all();
    };
    leader_options.events = &forwarder_;
    leader_options.layer_stored = [this](const std::string& ns, Rank rank,
                                         uint32_t step,
                                         absl::Span<const uint64_t> ops) {
      return layer_stored_ ? layer_stored_(ns, rank, step, ops)
                           : engine_->RankLayerStored(ops, step, rank);
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
            .heartbeat_interval = heartbeat_interval_,
            .heartbeat_timeout = heartbeat_timeout_,
            .events = &raw->hub},
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
  // Both ends' heartbeats (GroupLeaderOptions and GroupFollowerOptions); a
  // fixture may change them in its constructor, before SetUp.
  absl::Duration heartbeat_interval_ = kInterval;
  absl::Duration heartbeat_timeout_ = kTimeout;
  // The leader daemon's EventHub and forwarder (outlive the engine and the
  // GroupLeader), and the leader's layer_stored handler (default: the
  // engine's RankLayerStored); set before traffic.
  EventHub hub_;
  EventForwarder forwarder_;
  std::function<absl::Status(const std::string& ns, Rank rank, uint32_t step,
                             absl::Span<const uint64_t> ops)>
      layer_stored_;
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

}  // namespace hicache::group::testing
