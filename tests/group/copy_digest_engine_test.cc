// The accounting digest end to end, C = 4 split 2 + 2 over a loopback link:
// the leader's RoutingTransferEngine keeps ranks 0-1 on a CpuTransferEngine
// over its pools and sends ranks 2-3 through a RemoteTransferEngine to a
// FollowerExecutor running them on a CpuTransferEngine over pools of its
// own. Under concurrent traffic every digest matches; an injected skew in
// the follower's tally, or a copy the follower refuses, is caught by the
// next digest, which fails the member once on both sides.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/group/follower_executor.h"
#include "daemon/group/remote_transfer_engine.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_pool.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

constexpr uint32_t kP = 4;
constexpr uint32_t kC = 4;
constexpr int64_t kDevicePages = 32;
constexpr int64_t kHostPages = 64;
constexpr uint64_t kEpoch = 2;
constexpr absl::Duration kInterval = absl::Milliseconds(20);

// Completions per op, and every status.
class OpListener final : public TransferListener {
 public:
  void OnStepDone(StepDone done) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++per_op_[done.op_id];
    if (!done.status.ok()) {
      failed_.push_back(absl::Status(done.status.code(),
                                     std::string(done.status.message())));
      failed_sites_.push_back({done.op_id, done.rank});
    }
    ++total_;
    cv_.notify_all();
  }
  bool WaitOp(uint64_t op, int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30),
                        [&] { return per_op_[op] >= n; });
  }
  std::vector<absl::Status> failed() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_;
  }
  // The ranks of `op` that failed.
  std::vector<Rank> FailedRanks(uint64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Rank> out;
    for (const auto& [o, r] : failed_sites_) {
      if (o == op) out.push_back(r);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  int64_t total() {
    std::lock_guard<std::mutex> lock(mu_);
    return total_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, int> per_op_;
  std::vector<absl::Status> failed_;
  std::vector<std::pair<uint64_t, Rank>> failed_sites_;
  int64_t total_ = 0;
};

std::unique_ptr<RankPools> MakePools(const KvGeometry& geometry,
                                     std::vector<Rank> ranks,
                                     PoolBackend& backend) {
  auto layout = CpLayout::Create(kP, kC, std::move(ranks));
  EXPECT_TRUE(layout.ok()) << layout.status();
  auto pools = RankPools::Create(*layout, geometry,
                                 {.device_pages_per_rank = kDevicePages,
                                  .host_pages_per_rank = kHostPages},
                                 backend);
  EXPECT_TRUE(pools.ok()) << pools.status();
  return *std::move(pools);
}

class CopyDigestEngineTest : public ::testing::Test {
 protected:
  // `leader_knows_bounds`: the leader checks pages against the follower's
  // pools (as GroupLeader does); without it a bad page reaches the
  // follower, which refuses it.
  void Make(bool leader_knows_bounds = true) {
    geometry_ = std::make_unique<KvGeometry>(*KvGeometry::Preset("tiny", kP));
    static std::atomic<int> counter{0};
    const std::string prefix =
        absl::StrCat("/hicache-cd-", getpid(), "-", counter++);
    leader_backend_ = std::make_unique<ShmPoolBackend>(prefix + "-l");
    follower_backend_ = std::make_unique<ShmPoolBackend>(prefix + "-f");
    leader_pools_ = MakePools(*geometry_, {0, 1}, *leader_backend_);
    follower_pools_ = MakePools(*geometry_, {2, 3}, *follower_backend_);
    const uint32_t steps = geometry_->NumSteps();
    auto [leader_end, follower_end] =
        comm::LoopbackCommunicator::CreatePair("leader", "follower f1");
    const RankPools* fpools = follower_pools_.get();
    follower_ = std::make_unique<FollowerExecutor>(
        FollowerScope{.leader = "leader",
                      .ranks = {2, 3},
                      .num_steps = steps,
                      .device_pages_per_rank = kDevicePages,
                      .host_pages_per_rank = kHostPages},
        std::move(follower_end), kEpoch,
        [fpools](TransferListener* l) {
          return std::make_unique<CpuTransferEngine>(fpools, l, 2);
        },
        nullptr, [this](const absl::Status& cause) {
          std::lock_guard<std::mutex> lock(mu_);
          follower_failures_.push_back(
              absl::Status(cause.code(), std::string(cause.message())));
          cv_.notify_all();
        });
    const int64_t bound = leader_knows_bounds ? kDevicePages : 0;
    auto remote = std::make_shared<RemoteTransferEngine>(
        RemoteMember{.name = "follower 1 (f1)",
                     .ranks = {2, 3},
                     .num_steps = steps,
                     .device_pages_per_rank = bound,
                     .host_pages_per_rank = leader_knows_bounds ? kHostPages : 0},
        std::move(leader_end), kEpoch, &listener_, nullptr,
        RemoteTransferOptions{
            .step_timeout = absl::Seconds(60),
            .digest_interval = kInterval,
            .on_digest = [this](uint64_t frames, bool match) {
              std::lock_guard<std::mutex> lock(mu_);
              digests_.push_back({frames, match});
              cv_.notify_all();
            }});
    remote_ = remote.get();
    routing_ = std::make_unique<RoutingTransferEngine>(
        &listener_,
        std::make_unique<CpuTransferEngine>(leader_pools_.get(), &listener_,
                                            2),
        std::vector<Rank>{0, 1});
    ASSERT_TRUE(routing_->SetRoute({2, 3}, std::move(remote)).ok());
    ASSERT_TRUE(follower_->Start().ok());
    ASSERT_TRUE(remote_->Start().ok());
  }
  void TearDown() override {
    if (routing_ != nullptr) routing_->Drain();
    routing_.reset();  // The remote engine with it.
    follower_.reset();
    leader_pools_.reset();
    follower_pools_.reset();
  }

  // Thread `t`'s i-th task over every rank: its own pages (copies of
  // concurrent threads never touch the same bytes), both directions.
  TransferTask Task(int t, int i) const {
    TransferTask task{
        .op_id = static_cast<uint64_t>(t) * 100000 + i + 1,
        .direction = i % 2 ? TransferDirection::kHostToDevice
                           : TransferDirection::kDeviceToHost,
        .step = static_cast<uint32_t>(i) % geometry_->NumSteps()};
    const int n = 1 + i % 6;
    for (Rank r = 0; r < kC; ++r) {
      RankCopy copy{.rank = r};
      for (int k = 0; k < n; ++k) {
        copy.device_pages.push_back(1 + 7 * t + k);
        copy.host_pages.push_back(16 * t + (i + k) % 16);
      }
      task.ranks.push_back(std::move(copy));
    }
    return task;
  }
  // Four threads, `per_thread` tasks each, one in flight per thread.
  void Traffic(int per_thread, int first = 0) {
    std::vector<std::thread> threads;
    std::atomic<int> errors{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = first; i < first + per_thread; ++i) {
          TransferTask task = Task(t, i);
          const uint64_t op = task.op_id;
          if (!routing_->Submit(std::move(task)).ok() ||
              !listener_.WaitOp(op, kC)) {
            ++errors;
            return;
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    ASSERT_EQ(errors.load(), 0);
  }
  // Waits for a digest answered for at least `frames` Tasks frames;
  // returns whether it matched.
  std::optional<bool> AwaitDigestCovering(uint64_t frames) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<bool> out;
    cv_.wait_for(lock, std::chrono::seconds(30), [&] {
      for (const auto& [f, match] : digests_) {
        if (f >= frames || !match) {
          out = match;
          return true;
        }
      }
      return false;
    });
    return out;
  }
  absl::Status AwaitFollowerFailure() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30),
                 [&] { return !follower_failures_.empty(); });
    return follower_failures_.empty() ? absl::OkStatus()
                                      : follower_failures_.front();
  }

  std::unique_ptr<KvGeometry> geometry_;
  std::unique_ptr<ShmPoolBackend> leader_backend_;
  std::unique_ptr<ShmPoolBackend> follower_backend_;
  std::unique_ptr<RankPools> leader_pools_;
  std::unique_ptr<RankPools> follower_pools_;
  OpListener listener_;
  std::unique_ptr<FollowerExecutor> follower_;
  std::unique_ptr<RoutingTransferEngine> routing_;
  RemoteTransferEngine* remote_ = nullptr;  // Owned through routing_.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<uint64_t, bool>> digests_;
  std::vector<absl::Status> follower_failures_;
};

TEST_F(CopyDigestEngineTest, DigestsMatchUnderConcurrentTraffic) {
  ASSERT_NO_FATAL_FAILURE(Make());
  ASSERT_NO_FATAL_FAILURE(Traffic(150));
  routing_->Drain();
  EXPECT_TRUE(listener_.failed().empty()) << listener_.failed().front();
  EXPECT_EQ(listener_.total(), 4 * 150 * kC);
  const uint64_t frames = remote_->stats().task_frames;
  ASSERT_GT(frames, 0u);
  // A digest covering every frame comes within an interval, and matches.
  const std::optional<bool> last = AwaitDigestCovering(frames);
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(*last);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [f, match] : digests_) EXPECT_TRUE(match) << f;
  }
  const RemoteTransferEngine::Stats leader = remote_->stats();
  EXPECT_TRUE(remote_->failure().ok()) << remote_->failure();
  EXPECT_GE(leader.digests_matched, 1);
  EXPECT_EQ(leader.digest_divergences, 0);
  EXPECT_EQ(leader.step_timeouts, 0);
  const FollowerExecutor::Stats follower = follower_->stats();
  EXPECT_GE(follower.digests_checked, leader.digests_matched);
  EXPECT_EQ(follower.digests_matched, follower.digests_checked);
  EXPECT_FALSE(follower.diverged);
  EXPECT_NE(follower.last_digest_match, absl::InfinitePast());
  EXPECT_EQ(follower.steps_executed, 4 * 150 * 2);
  std::lock_guard<std::mutex> lock(mu_);
  EXPECT_TRUE(follower_failures_.empty());
}

TEST_F(CopyDigestEngineTest, InjectedDivergenceFailsTheMemberOnce) {
  ASSERT_NO_FATAL_FAILURE(Make());
  ASSERT_NO_FATAL_FAILURE(Traffic(20));
  routing_->Drain();
  ASSERT_EQ(AwaitDigestCovering(remote_->stats().task_frames), true);
  // The follower's accounting loses track of one page on rank 3.
  follower_->SkewTallyForTesting(3, 1);
  ASSERT_NO_FATAL_FAILURE(Traffic(5, 20));  // Frames since: a digest is due.
  const uint64_t frames = remote_->stats().task_frames;
  EXPECT_EQ(AwaitDigestCovering(frames), false);
  const absl::Status failure = remote_->failure();
  EXPECT_EQ(failure.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failure.message().find("pool accounting diverged at tasks frame"),
            std::string::npos)
      << failure;
  EXPECT_NE(failure.message().find("rank 3 pages device->host: leader "),
            std::string::npos)
      << failure;
  const absl::Status fatal = AwaitFollowerFailure();
  EXPECT_EQ(fatal.code(), absl::StatusCode::kDataLoss) << fatal;
  EXPECT_NE(fatal.message().find("diverged from the leader's"),
            std::string::npos)
      << fatal;
  // Remote ranks now fail; local ones still copy.
  TransferTask after = Task(0, 99);
  ASSERT_TRUE(routing_->Submit(std::move(after)).ok());
  ASSERT_TRUE(listener_.WaitOp(99 + 1, kC));
  routing_->Drain();
  EXPECT_EQ(listener_.FailedRanks(99 + 1), (std::vector<Rank>{2, 3}));
  for (const absl::Status& s : listener_.failed()) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  int mismatches = 0;
  for (const auto& [f, match] : digests_) mismatches += !match;
  EXPECT_EQ(mismatches, 1);
  EXPECT_EQ(follower_failures_.size(), 1u);
  EXPECT_EQ(remote_->stats().digest_divergences, 1);
  EXPECT_TRUE(follower_->stats().diverged);
}

TEST_F(CopyDigestEngineTest, ACopyTheFollowerRefusedIsADivergence) {
  ASSERT_NO_FATAL_FAILURE(Make(/*leader_knows_bounds=*/false));
  TransferTask bad = Task(1, 0);
  bad.ranks[2].device_pages[0] = kDevicePages + 5;  // Outside f1's pool.
  const uint64_t op = bad.op_id;
  ASSERT_TRUE(routing_->Submit(std::move(bad)).ok());
  ASSERT_TRUE(listener_.WaitOp(op, kC));
  EXPECT_EQ(AwaitDigestCovering(1), false);
  const absl::Status failure = remote_->failure();
  EXPECT_EQ(failure.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failure.message().find("rank 2 copies refused: leader 0, "
                                   "follower 1"),
            std::string::npos)
      << failure;
  EXPECT_EQ(AwaitFollowerFailure().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(follower_->stats().steps_refused, 1);
}

}  // namespace
}  // namespace hicache::group
