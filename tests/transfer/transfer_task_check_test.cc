#include "daemon/transfer/transfer_task_check.h"

#include <unistd.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/pool/shm_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A follower's bounds: ranks 1 and 2 of 4, 8 steps, 16 device and 32 host
// pages a rank, no fences, no rank twice.
TransferTaskBounds Bounds(std::string context = "") {
  return TransferTaskBounds{
      .context = std::move(context),
      .serves = [](Rank rank) { return rank == 1 || rank == 2; },
      .num_steps = 8,
      .device_pages_per_rank = 16,
      .host_pages_per_rank = 32,
      .refuse_fences = true,
      .refuse_repeated_ranks = true};
}

// One copy of `pages` pairs (device 1.., host 2..) on each of `ranks`.
TransferTask Task(uint32_t step, std::vector<Rank> ranks, int pages = 2) {
  TransferTask task{.op_id = 7, .step = step};
  for (Rank rank : ranks) {
    RankCopy copy{.rank = rank};
    for (int i = 0; i < pages; ++i) {
      copy.device_pages.push_back(1 + i);
      copy.host_pages.push_back(2 + i);
    }
    task.ranks.push_back(std::move(copy));
  }
  return task;
}

// The message of a refusal, after checking its code.
std::string Refusal(const absl::Status& status) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(TransferTaskCheck, AcceptsTasksInsideTheBounds) {
  EXPECT_TRUE(CheckTransferTask(Bounds(), Task(0, {1, 2})).ok());
  EXPECT_TRUE(CheckTransferTask(Bounds(), Task(7, {2})).ok());
  // No ranks, and empty page lists (a rank's no-op ack).
  EXPECT_TRUE(CheckTransferTask(Bounds(), Task(3, {})).ok());
  EXPECT_TRUE(CheckTransferTask(Bounds(), Task(3, {1, 2}, 0)).ok());
  // The last page of each pool.
  TransferTask last = Task(0, {1}, 1);
  last.ranks[0].device_pages[0] = 15;
  last.ranks[0].host_pages[0] = 31;
  EXPECT_TRUE(CheckTransferTask(Bounds(), last).ok());
}

TEST(TransferTaskCheck, RefusesAStepOutsideTheGeometry) {
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), Task(8, {1}))),
            "step 8 is outside the geometry's 8");
  // Even with no ranks to copy.
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), Task(9, {}))),
            "step 9 is outside the geometry's 8");
  // A geometry of no steps has none to copy (a bound set to 0 is a bound).
  TransferTaskBounds none = Bounds();
  none.num_steps = 0;
  EXPECT_THAT(Refusal(CheckTransferTask(none, Task(0, {1}))),
              HasSubstr("step 0 is outside"));
}

TEST(TransferTaskCheck, RefusesARankNotServed) {
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), Task(0, {1, 3}))),
            "rank 3 is not served");
}

TEST(TransferTaskCheck, RefusesARankNamedTwiceOnlyWhenAsked) {
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), Task(0, {2, 1, 2}))),
            "rank 2 is named twice");
  TransferTaskBounds twice_ok = Bounds();
  twice_ok.refuse_repeated_ranks = false;
  EXPECT_TRUE(CheckTransferTask(twice_ok, Task(0, {2, 1, 2})).ok());
}

TEST(TransferTaskCheck, RefusesAFenceOnlyWhenAsked) {
  TransferTask fenced = Task(0, {1, 2});
  fenced.ranks[1].wait_fence = 9;
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), fenced)),
            "rank 2: fence 9 named where no fences are accepted");
  TransferTaskBounds fences_ok = Bounds();
  fences_ok.refuse_fences = false;
  EXPECT_TRUE(CheckTransferTask(fences_ok, fenced).ok());
}

TEST(TransferTaskCheck, RefusesUnpairedPageLists) {
  TransferTask unpaired = Task(0, {1});
  unpaired.ranks[0].host_pages.pop_back();
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), unpaired)),
            "rank 1: 2 device pages but 1 host pages");
}

TEST(TransferTaskCheck, RefusesAPageOutsideItsPool) {
  struct Case {
    int64_t device;
    int64_t host;
  };
  for (const Case& c : std::vector<Case>{{16, 2}, {1, 32}, {-1, 2}, {1, -4}}) {
    TransferTask task = Task(0, {2});
    task.ranks[0].device_pages[1] = c.device;
    task.ranks[0].host_pages[1] = c.host;
    EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), task)),
              absl::StrCat("rank 2: page pair 1 (device ", c.device, ", host ",
                           c.host,
                           ") is outside the pools (16 device, 32 host "
                           "pages a rank)"));
  }
}

TEST(TransferTaskCheck, UnsetBoundsAreNotChecked) {
  const TransferTaskBounds open;  // Nothing set.
  TransferTask task = Task(std::numeric_limits<uint32_t>::max(), {0, 77, 0});
  task.ranks[0].wait_fence = 3;
  task.ranks[1].device_pages[0] = std::numeric_limits<int64_t>::max();
  task.ranks[1].host_pages[0] = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(CheckTransferTask(open, task).ok());
  // A negative page is refused all the same; the message names no sizes.
  task.ranks[2].host_pages[1] = -1;
  EXPECT_EQ(Refusal(CheckTransferTask(open, task)),
            "rank 0: page pair 1 (device 2, host -1) is outside the pools");
}

TEST(TransferTaskCheck, NamesThePoolSizesItKnows) {
  TransferTask task = Task(0, {1});
  task.ranks[0].device_pages[0] = -2;
  TransferTaskBounds device_only = Bounds();
  device_only.host_pages_per_rank.reset();
  EXPECT_THAT(Refusal(CheckTransferTask(device_only, task)),
              HasSubstr("is outside the pools (16 device pages a rank)"));
  TransferTaskBounds host_only = Bounds();
  host_only.device_pages_per_rank.reset();
  EXPECT_THAT(Refusal(CheckTransferTask(host_only, task)),
              HasSubstr("is outside the pools (32 host pages a rank)"));
  // Only the host bound applies then: a huge device page passes.
  task.ranks[0].device_pages[0] = 1 << 30;
  EXPECT_TRUE(CheckTransferTask(host_only, task).ok());
}

TEST(TransferTaskCheck, ReportsTheFirstProblem) {
  // The step before any copy; then copies in order.
  TransferTask task = Task(8, {3, 1});
  task.ranks[1].host_pages.clear();
  EXPECT_THAT(Refusal(CheckTransferTask(Bounds(), task)), StartsWith("step 8"));
  task.step = 0;
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), task)), "rank 3 is not served");
  task.ranks[0].rank = 2;
  EXPECT_EQ(Refusal(CheckTransferTask(Bounds(), task)),
            "rank 1: 2 device pages but 0 host pages");
}

TEST(TransferTaskCheck, PutsTheContextBeforeEveryMessage) {
  const TransferTaskBounds bounds = Bounds("follower 1 at 10.0.0.2:7070: ");
  TransferTask fenced = Task(0, {1});
  fenced.ranks[0].wait_fence = 4;
  TransferTask unpaired = Task(0, {1});
  unpaired.ranks[0].device_pages.pop_back();
  TransferTask outside = Task(0, {1});
  outside.ranks[0].device_pages[0] = 99;
  for (const TransferTask& task : {Task(8, {1}), Task(0, {0}), Task(0, {1, 1}),
                                   fenced, unpaired, outside}) {
    const std::string message = Refusal(CheckTransferTask(bounds, task));
    EXPECT_THAT(message, StartsWith("follower 1 at 10.0.0.2:7070: "));
    // The problem follows unchanged.
    EXPECT_EQ(
        message.substr(std::string("follower 1 at 10.0.0.2:7070: ").size()),
        Refusal(CheckTransferTask(Bounds(), task)));
  }
  EXPECT_TRUE(CheckTransferTask(bounds, Task(0, {1, 2})).ok());
}

TEST(TransferTaskCheck, ChecksOneCopyAtATime) {
  TransferTask task = Task(0, {2, 3, 2, 1});
  task.ranks[3].host_pages[0] = 32;
  EXPECT_TRUE(CheckRankCopy(Bounds(), task, 0).ok());
  EXPECT_EQ(Refusal(CheckRankCopy(Bounds(), task, 1)), "rank 3 is not served");
  // Named twice: the later copy is refused, the first one is not.
  EXPECT_EQ(Refusal(CheckRankCopy(Bounds(), task, 2)), "rank 2 is named twice");
  EXPECT_THAT(Refusal(CheckRankCopy(Bounds(), task, 3)),
              HasSubstr("rank 1: page pair 0 (device 1, host 32) is outside"));
  // The task's step applies to each copy.
  task.step = 8;
  EXPECT_EQ(Refusal(CheckRankCopy(Bounds("ctx: "), task, 0)),
            "ctx: step 8 is outside the geometry's 8");
}

// The bounds of this daemon's pools, for the local transfer engines.
class PoolsBoundsTest : public ::testing::Test {
 protected:
  std::unique_ptr<RankPools> Make(int64_t host_pages) {
    static int counter = 0;
    backend_ = std::make_unique<ShmPoolBackend>(
        absl::StrCat("/hicache-ttc-", getpid(), "-", counter++));
    geometry_ = std::make_unique<KvGeometry>(*KvGeometry::Preset("tiny", 4));
    auto pools = RankPools::Create(
        *CpLayout::Create(4, 4, {1, 3}), *geometry_,
        {.device_pages_per_rank = 16, .host_pages_per_rank = host_pages},
        *backend_);
    EXPECT_TRUE(pools.ok()) << pools.status();
    return *std::move(pools);
  }

  std::unique_ptr<ShmPoolBackend> backend_;
  std::unique_ptr<KvGeometry> geometry_;
};

TEST_F(PoolsBoundsTest, AreThePoolsRanksStepsAndSizes) {
  std::unique_ptr<RankPools> pools = Make(32);
  const uint32_t steps = geometry_->NumSteps();
  EXPECT_TRUE(CheckTransferTask(*pools, Task(steps - 1, {1, 3})).ok());
  EXPECT_EQ(Refusal(CheckTransferTask(*pools, Task(steps, {1}))),
            absl::StrCat("step ", steps, " is outside the geometry's ", steps));
  EXPECT_EQ(Refusal(CheckTransferTask(*pools, Task(0, {1, 2}))),
            "rank 2 is not served");
  EXPECT_EQ(Refusal(CheckTransferTask(*pools, Task(0, {5}))),
            "rank 5 is not served");
  TransferTask outside = Task(0, {3});
  outside.ranks[0].device_pages[0] = 16;
  EXPECT_EQ(Refusal(CheckTransferTask(*pools, outside)),
            "rank 3: page pair 0 (device 16, host 2) is outside the pools (16 "
            "device, 32 host pages a rank)");
  // Fences and repeated ranks are the engine's business.
  TransferTask fenced = Task(0, {1, 1});
  fenced.ranks[0].wait_fence = 5;
  EXPECT_TRUE(CheckTransferTask(*pools, fenced).ok());
  // An engine that takes no fences adds that to the pools' bounds.
  TransferTaskBounds no_fences = TransferTaskBoundsOf(*pools);
  no_fences.refuse_fences = true;
  EXPECT_THAT(Refusal(CheckTransferTask(no_fences, fenced)),
              HasSubstr("no fences"));
}

TEST_F(PoolsBoundsTest, ARankWithoutAHostPoolIsNotServed) {
  std::unique_ptr<RankPools> pools = Make(0);  // No host tier.
  ASSERT_NE(pools->device(1), nullptr);
  EXPECT_EQ(Refusal(CheckTransferTask(*pools, Task(0, {1}))),
            "rank 1 is not served");
  EXPECT_TRUE(CheckTransferTask(*pools, Task(0, {})).ok());
}

}  // namespace
}  // namespace hicache
