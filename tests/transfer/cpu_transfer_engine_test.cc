#include "daemon/backend/cpu/cpu_transfer_engine.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "daemon/pool/shm_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

class RecordingListener : public TransferListener {
 public:
  void OnStepDone(StepDone done) override {
    MutexLock lock(&mu_);
    ++acks_[{done.rank, done.step}];
    bytes_ += done.bytes;
    EXPECT_TRUE(done.status.ok());
    EXPECT_TRUE(done.fence.empty());  // The CPU backend has no events.
  }
  std::map<std::pair<Rank, uint32_t>, int> acks() {
    MutexLock lock(&mu_);
    return acks_;
  }

 private:
  Mutex mu_;
  std::map<std::pair<Rank, uint32_t>, int> acks_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// FP8 MLA rows (656 B), indexer rows (132 B) and a draft layer, at P = 4.
KvGeometry Fp8Geometry() {
  return *KvGeometry::Create(4,
                             {{"mla_fp8", 656, 2, false},
                              {"indexer_k", 132, 2, false},
                              {"draft_mla_fp8", 656, 1, true}},
                             "fp8-test");
}

class CpuTransferTest : public ::testing::TestWithParam<HostLayout> {
 protected:
  void SetUp() override {
    static int counter = 0;
    backend_ = std::make_unique<ShmPoolBackend>(
        absl::StrCat("/hicache-tt-", getpid(), "-", counter++));
    pools_ = *RankPools::Create(*CpLayout::Create(4, 2), Fp8Geometry(),
                                {.device_pages_per_rank = 16,
                                 .host_pages_per_rank = 16,
                                 .host_layout = GetParam()},
                                *backend_);
    engine_ = std::make_unique<CpuTransferEngine>(pools_.get(), &listener_, 3);
    std::mt19937 rng(5);
    for (Rank r = 0; r < 2; ++r) {
      auto* device = static_cast<uint8_t*>(pools_->device(r)->host_data());
      for (uint64_t i = 0; i < pools_->device(r)->size_bytes(); ++i) {
        device[i] = rng();
      }
    }
  }

  // The bytes of (page, family, layer) in a pool.
  std::string DeviceBlock(Rank r, int64_t page, int f, uint32_t l) {
    const KvGeometry& g = pools_->geometry();
    const char* base = static_cast<const char*>(pools_->device(r)->host_data());
    return std::string(base + g.DeviceOffset(16, page, f, l), g.BlockBytes(f));
  }
  std::string HostBlock(Rank r, int64_t page, int f, uint32_t l) {
    const KvGeometry& g = pools_->geometry();
    const char* base = static_cast<const char*>(pools_->host(r)->host_data());
    return std::string(base + g.HostOffset(GetParam(), 16, page, f, l),
                       g.BlockBytes(f));
  }

  RecordingListener listener_;
  std::unique_ptr<ShmPoolBackend> backend_;
  std::unique_ptr<RankPools> pools_;
  std::unique_ptr<CpuTransferEngine> engine_;
};

TEST_P(CpuTransferTest, RoundTripsEveryBlockOfEveryStep) {
  const KvGeometry& g = pools_->geometry();
  // Rank 0: a run (3, 4, 5 -> 7, 8, 9) and a stray pair; rank 1 owns nothing.
  RankCopy copy{0, {3, 4, 5, 11}, {7, 8, 9, 2}};
  RankCopy empty{1, {}, {}};
  for (uint32_t step = 0; step < g.NumSteps(); ++step) {
    ASSERT_TRUE(engine_
                    ->Submit({.op_id = 1,
                              .direction = TransferDirection::kDeviceToHost,
                              .step = step,
                              .ranks = {copy, empty}})
                    .ok());
  }
  engine_->Drain();
  for (uint32_t step = 0; step < g.NumSteps(); ++step) {
    for (const auto& [f, l] : g.StepBlocks(step)) {
      for (size_t i = 0; i < copy.device_pages.size(); ++i) {
        EXPECT_EQ(HostBlock(0, copy.host_pages[i], f, l),
                  DeviceBlock(0, copy.device_pages[i], f, l))
            << "step " << step << " family " << f << " pair " << i;
      }
    }
    // Every rank acked every step, the zero-owned one with a no-op.
    EXPECT_EQ((listener_.acks()[{0, step}]), 1);
    EXPECT_EQ((listener_.acks()[{1, step}]), 1);
  }
  // Back to other device pages.
  RankCopy back{0, {12, 13, 14, 15}, {7, 8, 9, 2}};
  for (uint32_t step = 0; step < g.NumSteps(); ++step) {
    ASSERT_TRUE(engine_
                    ->Submit({.op_id = 2,
                              .direction = TransferDirection::kHostToDevice,
                              .step = step,
                              .ranks = {back}})
                    .ok());
  }
  engine_->Drain();
  for (uint32_t step = 0; step < g.NumSteps(); ++step) {
    for (const auto& [f, l] : g.StepBlocks(step)) {
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(DeviceBlock(0, back.device_pages[i], f, l),
                  DeviceBlock(0, copy.device_pages[i], f, l));
      }
    }
  }
}

TEST_P(CpuTransferTest, CopyNowIsSynchronous) {
  RankCopy copy{1, {1, 2}, {3, 4}};
  auto bytes = engine_->CopyNow({.op_id = 3,
                                 .direction = TransferDirection::kDeviceToHost,
                                 .step = 0,
                                 .ranks = {copy}});
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, 2 * (656 + 132) * 4u);
  EXPECT_EQ(HostBlock(1, 4, 0, 0), DeviceBlock(1, 2, 0, 0));
}

TEST_P(CpuTransferTest, RejectsBadTasks) {
  auto submit = [&](TransferTask task) { return engine_->Submit(task); };
  EXPECT_THAT(submit({.step = 9, .ranks = {}}).message(), HasSubstr("step 9"));
  EXPECT_THAT(submit({.ranks = {RankCopy{0, {1, 2}, {1}}}}).message(),
              HasSubstr("2 device pages but 1 host pages"));
  EXPECT_THAT(submit({.ranks = {RankCopy{0, {16}, {1}}}}).message(),
              HasSubstr("outside the pools"));
  EXPECT_THAT(submit({.ranks = {RankCopy{5, {}, {}}}}).message(),
              HasSubstr("rank 5"));
  EXPECT_THAT(submit({.ranks = {RankCopy{0, {1}, {1}, /*wait_fence=*/3}}})
                  .message(),
              HasSubstr("no fences"));
  engine_->Drain();
  EXPECT_TRUE(listener_.acks().empty());
}

TEST_P(CpuTransferTest, HasNoFences) {
  EXPECT_EQ(engine_->RegisterFence(0, std::string(64, 'x')).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->ReleaseFence(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->FenceRank(1).status().code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CpuTransferTest,
                         ::testing::Values(HostLayout::kLayerFirst,
                                           HostLayout::kPageFirst));

}  // namespace
}  // namespace hicache
