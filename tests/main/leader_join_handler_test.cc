// LeaderJoinHandler over a REAL GroupLeader (a HiCacheEngine with
// pool_ranks = the leader's rank and a RoutingTransferEngine installed
// through wrap_transfer), with a scripted ConnectFn: a loopback end, an
// error, or a connect that blocks on a promise the test controls. The
// reply comes before the link connects; refusals never connect; a failed
// connect costs only an epoch; the queue is bounded; a timed-out Join's
// admission is dropped; Shutdown and destruction.
//
// Synchronisation is by std::promise/future and std::condition_variable
// only (TSan: Debian's Abseil is not instrumented). Every wait on something
// that must happen is bounded by kWait (a hang fails the test instead of
// timing it out); the one negative check ("not back yet") can only pass
// wrongly, never fail wrongly.
#include "daemon/main/leader_join_handler.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/group/group_follower.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/group_leader.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

using ConnectResult = absl::StatusOr<std::unique_ptr<comm::Communicator>>;
using JoinResult = absl::StatusOr<group::JoinReply>;

constexpr uint32_t kCp = 2;
constexpr uint32_t kP = 4;
constexpr int64_t kDevicePages = 32;
constexpr int64_t kHostPages = 64;
constexpr Rank kLeaderRank = 0;
constexpr Rank kMemberRank = 1;
// Heartbeats flow, but nobody is declared dead within a test.
constexpr absl::Duration kInterval = absl::Milliseconds(20);
constexpr absl::Duration kHealthTimeout = absl::Seconds(30);
// Bound on waiting for what must happen (a loaded CI machine under TSan).
constexpr std::chrono::seconds kWait{60};
constexpr size_t kMaxQueued = LeaderJoinHandler::kMaxQueued;

// gmock prints Debian's absl::string_view byte by byte: match a string.
std::string Msg(const absl::Status& status) {
  return std::string(status.message());
}

// TSan and refusals: a refusal's Status is made on the admission thread and
// its (refcounted) rep is shared by the Join's copy and the queued entry,
// which the admission thread drops a little later. Debian's Abseil is not
// instrumented, so TSan does not see the refcount order a free on that
// thread after the test's last read of its copy, and reports a race. Tests
// therefore keep every refused JoinResult alive until the admission thread
// has moved on (a later connect, or the handler destroyed): the test's copy
// is then the last owner and the free happens on the test's own thread.

template <typename T>
bool Ready(const std::future<T>& future) {
  return future.wait_for(kWait) == std::future_status::ready;
}

// A connect that blocks until the test releases it (at most once each).
// Owned by the fixture, so that a test failing before its Release cannot
// leave the admission thread blocked or reading a dead promise: TearDown
// releases it before the handler is destroyed.
struct Gate {
  std::promise<std::string> entered;  // The prefix it was called with.
  std::future<std::string> entered_future = entered.get_future();
  std::promise<ConnectResult> release;
  std::future<ConnectResult> release_future = release.get_future();
  std::atomic<bool> released{false};

  ConnectResult Pass(const std::string& prefix) {
    entered.set_value(prefix);
    return release_future.get();
  }
  void Release(ConnectResult result) {
    if (!released.exchange(true)) release.set_value(std::move(result));
  }
};

// A follower daemon's side: its own pools for its ranks and a GroupFollower.
struct FollowerSide {
  std::unique_ptr<ShmPoolBackend> backend;
  std::unique_ptr<RankPools> pools;
  std::unique_ptr<group::GroupFollower> follower;

  ~FollowerSide() {
    follower.reset();  // Its copies use the pools.
    pools.reset();
  }
};

class LeaderJoinHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_ = EngineOptions{.page_size = kP,
                             .cp_size = kCp,
                             .kv_preset = "tiny",
                             .device_pages_per_rank = kDevicePages,
                             .host_pages_per_rank = kHostPages};
    options_.pool_ranks = {kLeaderRank};
    EngineOptions engine_options = options_;
    engine_options.wrap_transfer =
        [this](TransferListener* listener,
               const TransferEngineFactory& backend)
        -> std::unique_ptr<TransferEngine> {
      auto routing = std::make_unique<group::RoutingTransferEngine>(
          listener, backend(listener),
          std::vector<Rank>{kLeaderRank});
      routing_ = routing.get();
      return routing;
    };
    auto engine = HiCacheEngine::Create(engine_options);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    ASSERT_NE(routing_, nullptr);
    auto leader = group::GroupLeader::Create(
        group::GroupLeaderOptions{
            .group_name = "g",
            .cp_size = kCp,
            .geometry = group::GroupGeometryFrom(options_, engine_->geometry()),
            .heartbeat_interval = kInterval,
            .heartbeat_timeout = kHealthTimeout},
        engine_.get(), routing_);
    ASSERT_TRUE(leader.ok()) << leader.status();
    leader_ = *std::move(leader);
  }

  void TearDown() override {
    gate_.Release(absl::CancelledError("the test ended"));
    handler_.reset();  // Joins its thread.
    member_end_.reset();
    leader_.reset();   // Before the engine (its routing engine) goes.
    followers_.clear();
    engine_.reset();
  }

  // The handler, with `script` as the connect step (every call recorded).
  void MakeHandler(std::function<ConnectResult(const std::string&)> script,
                   absl::Duration reply_timeout = absl::Seconds(30)) {
    script_ = std::move(script);
    handler_ = std::make_unique<LeaderJoinHandler>(
        "g", "lead", leader_.get(),
        [this](const std::string& prefix) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            connects_.push_back(prefix);
          }
          return script_(prefix);
        },
        [this](const std::string& prefix) {
          std::lock_guard<std::mutex> lock(mu_);
          links_done_.push_back(prefix);
          cv_.notify_all();
        },
        reply_timeout);
  }

  group::GroupGeometry Geometry(std::vector<Rank> ranks) const {
    EngineOptions o = options_;
    o.pool_ranks = std::move(ranks);
    return group::GroupGeometryFrom(o, engine_->geometry());
  }

  std::future<JoinResult> AsyncJoin(std::string name) {
    return std::async(std::launch::async, [this, name] {
      return handler_->Join(name, Geometry({kMemberRank}));
    });
  }

  std::vector<std::string> Connects() {
    std::lock_guard<std::mutex> lock(mu_);
    return connects_;
  }
  std::vector<std::string> LinksDone() {
    std::lock_guard<std::mutex> lock(mu_);
    return links_done_;
  }
  // The on_link_done calls once there are `n` (fails the test if they do
  // not come).
  std::vector<std::string> AwaitLinksDone(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, kWait, [&] { return links_done_.size() >= n; }))
        << "on_link_done called " << links_done_.size() << " times, want "
        << n;
    return links_done_;
  }

  // A follower daemon for `ranks` with fresh pools.
  FollowerSide* NewFollower(const std::vector<Rank>& ranks) {
    static std::atomic<int> counter{0};
    auto side = std::make_unique<FollowerSide>();
    side->backend = std::make_unique<ShmPoolBackend>(
        absl::StrCat("/hicache-ljh-", getpid(), "-", counter++));
    auto layout = CpLayout::Create(kP, kCp, ranks);
    EXPECT_TRUE(layout.ok()) << layout.status();
    auto pools = RankPools::Create(*layout, engine_->geometry(),
                                   {.device_pages_per_rank = kDevicePages,
                                    .host_pages_per_rank = kHostPages,
                                    .host_layout = options_.host_layout},
                                   *side->backend);
    EXPECT_TRUE(pools.ok()) << pools.status();
    side->pools = *std::move(pools);
    const RankPools* raw_pools = side->pools.get();
    side->follower = std::make_unique<group::GroupFollower>(
        group::GroupFollowerOptions{
            .group_name = "g",
            .cp_size = kCp,
            .leader = "lead",
            .scope = {.ranks = ranks,
                      .num_steps = engine_->geometry().NumSteps(),
                      .device_pages_per_rank = kDevicePages,
                      .host_pages_per_rank = kHostPages},
            .heartbeat_interval = kInterval,
            .heartbeat_timeout = kHealthTimeout},
        [raw_pools](TransferListener* listener) {
          return std::make_unique<CpuTransferEngine>(raw_pools, listener, 2);
        },
        // Counted: the leader's Stop in TearDown is a loss too.
        [this](const absl::Status&) { ++follower_fatals_; });
    followers_.push_back(std::move(side));
    return followers_.back().get();
  }

  // Starts 1 + kMaxQueued Joins named "q0".."q16" while an admission's
  // connect blocks, and returns once the first of them came back: that one
  // was refused for a full queue, so the other kMaxQueued are queued.
  // `first` is its index.
  std::vector<std::future<JoinResult>> FillTheQueue(size_t* first) {
    auto came_back = std::make_shared<std::promise<size_t>>();
    auto claimed = std::make_shared<std::atomic<bool>>(false);
    std::vector<std::future<JoinResult>> joins;
    for (size_t i = 0; i <= kMaxQueued; ++i) {
      joins.push_back(std::async(std::launch::async, [=, this] {
        JoinResult result =
            handler_->Join(absl::StrCat("q", i), Geometry({kMemberRank}));
        if (!claimed->exchange(true)) came_back->set_value(i);
        return result;
      }));
    }
    std::future<size_t> first_back = came_back->get_future();
    if (!Ready(first_back)) {
      // A hang would only end at the test's timeout; say why instead.
      std::fprintf(stderr, "no Join came back while the queue filled\n");
      std::abort();
    }
    *first = first_back.get();
    return joins;
  }

  EngineOptions options_;
  std::unique_ptr<HiCacheEngine> engine_;
  group::RoutingTransferEngine* routing_ = nullptr;  // Owned by the engine.
  std::unique_ptr<group::GroupLeader> leader_;
  std::vector<std::unique_ptr<FollowerSide>> followers_;
  std::function<ConnectResult(const std::string&)> script_;
  std::unique_ptr<LeaderJoinHandler> handler_;
  Gate gate_;
  std::atomic<bool> connect_returned_{false};
  // A member's end of the link the scripted connect made; read by the test
  // only after on_link_done (which orders it after the connect).
  std::unique_ptr<comm::LoopbackCommunicator> member_end_;
  std::atomic<int> follower_fatals_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> connects_;    // Guarded by mu_.
  std::vector<std::string> links_done_;  // Guarded by mu_.
};

TEST(LeaderJoinHandlerPrefixTest, NamesGroupEpochAndMember) {
  EXPECT_EQ(LeaderJoinHandler::Prefix("g", 7, "node-2"), "cp/g/7/node-2/");
  // Epochs are delimited: epoch 1 never prefixes epoch 12's keys.
  EXPECT_FALSE(absl::StartsWith(LeaderJoinHandler::Prefix("g", 12, "m"),
                                LeaderJoinHandler::Prefix("g", 1, "")));
}

TEST_F(LeaderJoinHandlerTest, AnswersBeforeTheLinkConnectsThenAdmits) {
  MakeHandler([&](const std::string& prefix) { return gate_.Pass(prefix); });
  std::future<JoinResult> join = AsyncJoin("f1");

  // The reply arrives while the leader's connect is still blocked.
  ASSERT_TRUE(Ready(join));
  JoinResult reply = join.get();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->member_index, 1u);
  EXPECT_EQ(reply->epoch, 1u);
  EXPECT_EQ(reply->rendezvous_prefix, "cp/g/1/f1/");
  EXPECT_EQ(reply->leader_name, "lead");
  ASSERT_TRUE(Ready(gate_.entered_future));
  EXPECT_EQ(gate_.entered_future.get(), "cp/g/1/f1/");
  // Nothing is installed and no link is done until the connect returns.
  EXPECT_TRUE(LinksDone().empty());
  EXPECT_EQ(leader_->Status().members.size(), 1u);
  EXPECT_EQ(engine_->UnavailableLanes(),
            std::vector<Rank>{kMemberRank});

  // The member connects its end with what the reply told it.
  auto [leader_end, member_end] =
      comm::LoopbackCommunicator::CreatePair("lead", "f1");
  gate_.Release(std::move(leader_end));
  EXPECT_EQ(AwaitLinksDone(1), std::vector<std::string>{"cp/g/1/f1/"});
  FollowerSide* f = NewFollower({kMemberRank});
  ASSERT_TRUE(f->follower
                  ->Run(std::move(member_end), reply->epoch,
                        reply->member_index)
                  .ok());

  group::GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, group::GroupState::kFormed);
  EXPECT_EQ(status.epoch, 1u);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.members[1].name, "f1");
  EXPECT_TRUE(status.members[1].live);
  EXPECT_EQ(status.members[1].ranks, std::vector<Rank>{kMemberRank});
  EXPECT_TRUE(engine_->UnavailableLanes().empty());
  EXPECT_EQ(f->follower->Status().state, group::GroupState::kFormed);
  EXPECT_EQ(Connects(), std::vector<std::string>{"cp/g/1/f1/"});
  EXPECT_EQ(follower_fatals_, 0);
}

TEST_F(LeaderJoinHandlerTest, RefusalsAreTheJoinsErrorAndNeverConnect) {
  MakeHandler([](const std::string& prefix) -> ConnectResult {
    if (absl::StrContains(prefix, "/ok/")) {
      return absl::UnavailableError("no link in this test");
    }
    ADD_FAILURE() << "connect called for a refused member: " << prefix;
    return absl::InternalError("refused members never connect");
  });

  group::GroupGeometry bigger = Geometry({kMemberRank});
  bigger.host_pages_per_rank += 1;
  // Kept alive to the end (see "TSan and refusals").
  const JoinResult bigger_refused = handler_->Join("f1", bigger);
  EXPECT_EQ(bigger_refused.status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(bigger_refused.status()), HasSubstr("host_pages_per_rank"));

  group::GroupGeometry other_build = Geometry({kMemberRank});
  other_build.build = "someone else's build";
  const JoinResult build_refused = handler_->Join("f\n2", other_build);
  EXPECT_EQ(build_refused.status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(build_refused.status()), HasSubstr("f\\n2"));
  EXPECT_THAT(Msg(build_refused.status()), ::testing::Not(HasSubstr("\n")));

  // Rank conflict: the leader's own rank.
  const JoinResult rank_refused = handler_->Join("f3", Geometry({kLeaderRank}));
  EXPECT_EQ(rank_refused.status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(rank_refused.status()), HasSubstr("f3"));
  // Both ranks: overlaps the leader too.
  const JoinResult both_refused =
      handler_->Join("f4", Geometry({kLeaderRank, kMemberRank}));
  EXPECT_EQ(both_refused.status().code(),
            absl::StatusCode::kFailedPrecondition);

  // No refusal used an epoch, connected or finished a link: the next
  // admission (serialized after them) gets epoch 1 and the only link.
  JoinResult ok = handler_->Join("ok", Geometry({kMemberRank}));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->epoch, 1u);
  EXPECT_EQ(AwaitLinksDone(1), std::vector<std::string>{"cp/g/1/ok/"});
  EXPECT_EQ(Connects(), std::vector<std::string>{"cp/g/1/ok/"});
  EXPECT_EQ(leader_->Status().members.size(), 1u);
  handler_.reset();  // Before the refusals go (see "TSan and refusals").
}

TEST_F(LeaderJoinHandlerTest, StoppedLeaderRefusesWithoutConnecting) {
  MakeHandler([](const std::string& prefix) -> ConnectResult {
    ADD_FAILURE() << "connect called: " << prefix;
    return absl::InternalError("unexpected");
  });
  leader_->Stop();
  JoinResult refused = handler_->Join("f1", Geometry({kMemberRank}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(refused.status()), HasSubstr("stopped"));
  EXPECT_TRUE(Connects().empty());
  handler_.reset();  // Before `refused` goes (see "TSan and refusals").
}

TEST_F(LeaderJoinHandlerTest, ConnectFailureCostsOnlyAnEpochAndTheMemberRejoins) {
  MakeHandler([&](const std::string& prefix) -> ConnectResult {
    if (prefix == "cp/g/1/f1/") {
      return absl::DeadlineExceededError("rendezvous timed out");
    }
    auto [leader_end, member] =
        comm::LoopbackCommunicator::CreatePair("lead", "f1");
    member_end_ = std::move(member);
    return std::move(leader_end);
  });

  // The reply went out before the connect failed: the Join succeeds.
  JoinResult first = handler_->Join("f1", Geometry({kMemberRank}));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->epoch, 1u);
  EXPECT_EQ(AwaitLinksDone(1), std::vector<std::string>{"cp/g/1/f1/"});
  group::GroupStatus status = leader_->Status();
  EXPECT_EQ(status.epoch, 1u);  // Used up.
  EXPECT_EQ(status.members.size(), 1u);
  EXPECT_EQ(status.state, group::GroupState::kForming);
  EXPECT_EQ(status.deaths, 0);
  EXPECT_EQ(engine_->UnavailableLanes(),
            std::vector<Rank>{kMemberRank});

  // The member, whose own connect failed too, joins again.
  JoinResult second = handler_->Join("f1", Geometry({kMemberRank}));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->epoch, 2u);
  EXPECT_EQ(second->member_index, 1u);
  EXPECT_EQ(second->rendezvous_prefix, "cp/g/2/f1/");
  EXPECT_EQ(AwaitLinksDone(2),
            (std::vector<std::string>{"cp/g/1/f1/", "cp/g/2/f1/"}));
  ASSERT_NE(member_end_, nullptr);
  FollowerSide* f = NewFollower({kMemberRank});
  ASSERT_TRUE(f->follower
                  ->Run(std::move(member_end_), second->epoch,
                        second->member_index)
                  .ok());
  status = leader_->Status();
  EXPECT_EQ(status.state, group::GroupState::kFormed);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_EQ(status.members[1].epoch, 2u);
  EXPECT_EQ(f->follower->Status().state, group::GroupState::kFormed);
  EXPECT_EQ(follower_fatals_, 0);
}

TEST_F(LeaderJoinHandlerTest, QueueIsBoundedWhileAConnectBlocks) {
  MakeHandler([&](const std::string& prefix) -> ConnectResult {
    if (prefix == "cp/g/1/a/") return gate_.Pass(prefix);
    return absl::UnavailableError("no link in this test");
  });
  std::future<JoinResult> a = AsyncJoin("a");
  ASSERT_TRUE(Ready(a));  // Taken by the admission thread, connecting.
  ASSERT_TRUE(a.get().ok());

  size_t first = 0;
  std::vector<std::future<JoinResult>> joins = FillTheQueue(&first);
  JoinResult refused = joins[first].get();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(refused.status()),
              HasSubstr(absl::StrCat(kMaxQueued, " admissions already wait")));

  gate_.Release(absl::UnavailableError("a's link failed"));
  std::set<uint64_t> epochs;
  for (size_t i = 0; i < joins.size(); ++i) {
    if (i == first) continue;
    ASSERT_TRUE(Ready(joins[i])) << i;
    JoinResult reply = joins[i].get();
    ASSERT_TRUE(reply.ok()) << i << ": " << reply.status();
    EXPECT_EQ(reply->rendezvous_prefix,
              absl::StrCat("cp/g/", reply->epoch, "/q", i, "/"));
    epochs.insert(reply->epoch);
  }
  // Every queued one was admitted in turn with an epoch of its own; the
  // refused one never reached the leader.
  EXPECT_EQ(epochs.size(), kMaxQueued);
  EXPECT_EQ(*epochs.begin(), 2u);
  EXPECT_EQ(*epochs.rbegin(), kMaxQueued + 1);
  const std::vector<std::string> done = AwaitLinksDone(kMaxQueued + 1);
  EXPECT_EQ(done.size(), kMaxQueued + 1);
  for (const std::string& prefix : Connects()) {
    EXPECT_FALSE(absl::EndsWith(prefix, absl::StrCat("/q", first, "/")))
        << prefix;
  }
  EXPECT_EQ(leader_->Status().epoch, kMaxQueued + 1);
}

TEST_F(LeaderJoinHandlerTest, TimedOutJoinIsUnavailableAndItsAdmissionDropped) {
  constexpr absl::Duration kReplyTimeout = absl::Seconds(2);
  MakeHandler(
      [&](const std::string& prefix) -> ConnectResult {
        if (prefix == "cp/g/1/a/") return gate_.Pass(prefix);
        return absl::UnavailableError("no link in this test");
      },
      kReplyTimeout);
  std::future<JoinResult> a = AsyncJoin("a");
  ASSERT_TRUE(Ready(a));
  ASSERT_TRUE(a.get().ok());

  // b waits behind a's connect past its reply timeout.
  const absl::Time before = absl::Now();
  JoinResult b = handler_->Join("b", Geometry({kMemberRank}));
  EXPECT_GE(absl::Now() - before, kReplyTimeout);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(b.status()), HasSubstr("no admission within"));

  gate_.Release(absl::UnavailableError("a's link failed"));
  EXPECT_EQ(AwaitLinksDone(1), std::vector<std::string>{"cp/g/1/a/"});
  // b's admission was dropped: c gets the next epoch, and b never got one
  // nor a connect.
  JoinResult c = handler_->Join("c", Geometry({kMemberRank}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->epoch, 2u);
  EXPECT_EQ(AwaitLinksDone(2),
            (std::vector<std::string>{"cp/g/1/a/", "cp/g/2/c/"}));
  EXPECT_EQ(Connects(), (std::vector<std::string>{"cp/g/1/a/", "cp/g/2/c/"}));
  EXPECT_EQ(leader_->Status().epoch, 2u);
}

TEST_F(LeaderJoinHandlerTest, ShutdownAnswersTheQueuedAndRefusesLaterJoins) {
  MakeHandler([&](const std::string& prefix) -> ConnectResult {
    if (prefix == "cp/g/1/a/") return gate_.Pass(prefix);
    ADD_FAILURE() << "admitted after Shutdown: " << prefix;
    return absl::InternalError("unexpected");
  });
  std::future<JoinResult> a = AsyncJoin("a");
  ASSERT_TRUE(Ready(a));
  ASSERT_TRUE(a.get().ok());
  size_t first = 0;
  std::vector<std::future<JoinResult>> joins = FillTheQueue(&first);
  EXPECT_EQ(joins[first].get().status().code(),
            absl::StatusCode::kUnavailable);

  // Shutdown returns while a's connect still blocks, and answers every
  // queued Join at once.
  handler_->Shutdown();
  for (size_t i = 0; i < joins.size(); ++i) {
    if (i == first) continue;
    ASSERT_TRUE(Ready(joins[i])) << i;
    JoinResult result = joins[i].get();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << i;
    EXPECT_THAT(Msg(result.status()), HasSubstr("shutting down")) << i;
  }
  JoinResult later = handler_->Join("late", Geometry({kMemberRank}));
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(later.status()), HasSubstr("shutting down"));
  handler_->Shutdown();  // Idempotent.

  // The admission in progress still finishes and reclaims its keys.
  EXPECT_TRUE(LinksDone().empty());
  gate_.Release(absl::UnavailableError("a's link failed"));
  EXPECT_EQ(AwaitLinksDone(1), std::vector<std::string>{"cp/g/1/a/"});
  EXPECT_EQ(Connects(), std::vector<std::string>{"cp/g/1/a/"});
  EXPECT_EQ(leader_->Status().epoch, 1u);
}

TEST_F(LeaderJoinHandlerTest, DestructionWaitsForTheConnectInProgress) {
  MakeHandler([&](const std::string& prefix) -> ConnectResult {
    ConnectResult result = gate_.Pass(prefix);
    connect_returned_ = true;
    return result;
  });
  std::future<JoinResult> a = AsyncJoin("a");
  ASSERT_TRUE(Ready(a));
  ASSERT_TRUE(a.get().ok());
  ASSERT_TRUE(Ready(gate_.entered_future));

  std::future<bool> destroyed = std::async(std::launch::async, [&] {
    handler_.reset();
    return connect_returned_.load();
  });
  // Not back while the connect blocks (a weak check: it cannot fail wrongly).
  EXPECT_EQ(destroyed.wait_for(std::chrono::milliseconds(200)),
            std::future_status::timeout);
  gate_.Release(absl::UnavailableError("a's link failed"));
  ASSERT_TRUE(Ready(destroyed));
  // The destructor returned only after the connect did, and after the
  // finished link's keys were handed back.
  EXPECT_TRUE(destroyed.get());
  EXPECT_EQ(LinksDone(), std::vector<std::string>{"cp/g/1/a/"});
}

// A second daemon claiming the ranks of a live member (a restarted member
// whose old self is still alive, or a copy-pasted --ranks) is refused
// naming the live one, and connects nothing.
TEST_F(LeaderJoinHandlerTest, LiveMembersRanksAreRefusedToASecondDaemon) {
  MakeHandler([&](const std::string& prefix) -> ConnectResult {
    if (prefix != "cp/g/1/f1/") {
      ADD_FAILURE() << "connect called for a refused member: " << prefix;
      return absl::InternalError("unexpected");
    }
    auto [leader_end, member] =
        comm::LoopbackCommunicator::CreatePair("lead", "f1");
    member_end_ = std::move(member);
    return std::move(leader_end);
  });
  JoinResult first = handler_->Join("f1", Geometry({kMemberRank}));
  ASSERT_TRUE(first.ok()) << first.status();
  AwaitLinksDone(1);
  FollowerSide* f = NewFollower({kMemberRank});
  ASSERT_TRUE(f->follower
                  ->Run(std::move(member_end_), first->epoch,
                        first->member_index)
                  .ok());
  std::vector<JoinResult> refused;  // See "TSan and refusals".
  for (const char* name : {"f2", "f1"}) {  // Another name, or the same.
    refused.push_back(handler_->Join(name, Geometry({kMemberRank})));
    EXPECT_EQ(refused.back().status().code(),
              absl::StatusCode::kFailedPrecondition)
        << name;
    EXPECT_THAT(Msg(refused.back().status()), HasSubstr("f1")) << name;
  }
  EXPECT_EQ(Connects(), std::vector<std::string>{"cp/g/1/f1/"});
  group::GroupStatus status = leader_->Status();
  EXPECT_EQ(status.state, group::GroupState::kFormed);
  EXPECT_EQ(status.epoch, 1u);
  ASSERT_EQ(status.members.size(), 2u);
  EXPECT_TRUE(status.members[1].live);
  EXPECT_EQ(follower_fatals_, 0);
  handler_.reset();  // Before `refused` goes.
}

// A connect that "succeeds" without a link: the leader refuses it INTERNAL
// after the reply went out; nothing is installed and the keys are reclaimed.
TEST_F(LeaderJoinHandlerTest, ConnectWithoutALinkChangesNothingButTheEpoch) {
  MakeHandler([](const std::string&) -> ConnectResult {
    return std::unique_ptr<comm::Communicator>();
  });
  JoinResult reply = handler_->Join("f1", Geometry({kMemberRank}));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(AwaitLinksDone(1), std::vector<std::string>{"cp/g/1/f1/"});
  group::GroupStatus status = leader_->Status();
  EXPECT_EQ(status.epoch, 1u);
  EXPECT_EQ(status.members.size(), 1u);
  EXPECT_EQ(engine_->UnavailableLanes(),
            std::vector<Rank>{kMemberRank});
}

// Joins from many threads racing Shutdown: each is answered (a reply with
// an epoch of its own, or UNAVAILABLE), none hangs, and every admission
// that started hands its keys back.
TEST_F(LeaderJoinHandlerTest, JoinsRacingShutdownAreAllAnswered) {
  MakeHandler([](const std::string&) -> ConnectResult {
    return absl::UnavailableError("no link in this test");
  });
  constexpr int kThreads = 6;
  constexpr int kJoinsEach = 20;
  std::promise<void> some_answered;
  std::atomic<int> answered{0};
  std::vector<std::future<std::vector<JoinResult>>> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.push_back(std::async(std::launch::async, [&, t] {
      std::vector<JoinResult> results;
      for (int i = 0; i < kJoinsEach; ++i) {
        results.push_back(handler_->Join(absl::StrCat("t", t, "-", i),
                                         Geometry({kMemberRank})));
        if (++answered == kThreads) some_answered.set_value();
      }
      return results;
    }));
  }
  ASSERT_TRUE(Ready(some_answered.get_future()));
  handler_->Shutdown();
  std::set<uint64_t> epochs;
  int replies = 0;
  for (auto& thread : threads) {
    ASSERT_TRUE(Ready(thread));
    for (const JoinResult& result : thread.get()) {
      if (result.ok()) {
        ++replies;
        EXPECT_TRUE(epochs.insert(result->epoch).second) << result->epoch;
        EXPECT_TRUE(absl::StartsWith(result->rendezvous_prefix,
                                     absl::StrCat("cp/g/", result->epoch, "/t")))
            << result->rendezvous_prefix;
      } else {
        EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable)
            << result.status();
        EXPECT_THAT(Msg(result.status()), HasSubstr("shutting down"));
      }
    }
  }
  EXPECT_GE(replies, kThreads);
  // Destroying the handler joins its thread: after that every started
  // admission has finished and handed its link's keys back.
  handler_.reset();
  EXPECT_EQ(LinksDone().size(), Connects().size());
  EXPECT_EQ(Connects().size(), static_cast<size_t>(replies));
  EXPECT_EQ(leader_->Status().epoch, static_cast<uint64_t>(replies));
}

// Reproduction: an abandoned entry stayed in queue_ (and counted against
// kMaxQueued) until the admission thread popped it, which is only after the
// connect in progress returns. So once kMaxQueued Joins had timed out
// behind a slow connect, every new Join was refused "16 admissions already
// wait" although nobody waited.
TEST_F(LeaderJoinHandlerTest,
       TimedOutJoinsDoNotHoldQueueSlots) {
  constexpr absl::Duration kReplyTimeout = absl::Milliseconds(300);
  MakeHandler(
      [&](const std::string& prefix) -> ConnectResult {
        if (prefix == "cp/g/1/a/") return gate_.Pass(prefix);
        return absl::UnavailableError("no link in this test");
      },
      kReplyTimeout);
  std::future<JoinResult> a = AsyncJoin("a");
  ASSERT_TRUE(Ready(a));
  ASSERT_TRUE(a.get().ok());
  std::vector<std::future<JoinResult>> joins;
  for (size_t i = 0; i < kMaxQueued; ++i) {
    joins.push_back(AsyncJoin(absl::StrCat("t", i)));
  }
  for (size_t i = 0; i < joins.size(); ++i) {
    ASSERT_TRUE(Ready(joins[i]));
    JoinResult result = joins[i].get();
    EXPECT_THAT(Msg(result.status()), HasSubstr("no admission within"))
        << i;
  }
  // Nobody waits now: a new Join is queued (and times out in turn), not
  // refused for a full queue.
  JoinResult fresh = handler_->Join("fresh", Geometry({kMemberRank}));
  EXPECT_EQ(fresh.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(fresh.status()), HasSubstr("no admission within"));
  gate_.Release(absl::UnavailableError("a's link failed"));
  AwaitLinksDone(1);
}

}  // namespace
}  // namespace hicache
