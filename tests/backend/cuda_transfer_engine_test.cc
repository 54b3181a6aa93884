// CudaTransferEngine on SimCudaRuntime, or on the GPU with
// HICACHE_CUDA_RUNTIME=real (cuda_engine_rig.h): byte exactness, launches,
// fences, failures, ordering, Drain and shutdown.

#include "daemon/backend/cuda/cuda_transfer_engine.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/backend/cuda/cuda_pool_backend.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/core/mutex.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"
#include "daemon/pool/rank_pools.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/backend/cuda_engine_rig.h"
#include "tests/backend/cuda_test_support.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using testing::kD2H;
using testing::kH2D;
using testing::PatternBytes;
using testing::RecordingListener;
using testing::RecordingRuntime;
using testing::RigConfig;

using CudaTransferEngineTest = testing::CudaEngineRig;

// --- Byte exactness
// -----------------------------------------------------------

class RoundTripTest : public CudaTransferEngineTest,
                      public ::testing::WithParamInterface<
                          std::tuple<std::string, HostLayout>> {
 protected:
  void SetUp() override {
    Build(RigConfig{.preset = std::get<0>(GetParam()),
                    .host_layout = std::get<1>(GetParam())});
  }
};

TEST_P(RoundTripTest, DeviceToHostThenBackIsByteExact) {
  const uint32_t steps = geometry().NumSteps();
  const std::vector<uint8_t> source1 = FillDevice(1, 11);
  const std::vector<uint8_t> source3 = FillDevice(3, 33);
  // Out of order, non-contiguous, different pages on each side.
  const RankCopy out1 = Copy(1, {1, 2, 3}, {4, 0, 2});
  const RankCopy out3 = Copy(3, {3, 1}, {5, 1});

  std::vector<uint8_t> want_host1 = HostImage(1);
  std::vector<uint8_t> want_host3 = HostImage(3);
  std::vector<uint8_t> device1 = source1, device3 = source3;
  const size_t launches_before = runtime_.launches().size();
  for (uint32_t step = 0; step < steps; ++step) {
    ASSERT_TRUE(engine_
                    ->Submit(TransferTask{.op_id = 1,
                                          .direction = kD2H,
                                          .step = step,
                                          .ranks = {out1, out3}})
                    .ok());
    Model(kD2H, step, out1, device1.data(), want_host1.data());
    Model(kD2H, step, out3, device3.data(), want_host3.data());
  }
  engine_->Drain();
  EXPECT_EQ(runtime_.launches().size() - launches_before, 2 * steps);
  ASSERT_EQ(listener_.count(), 2 * steps);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(done.direction, kD2H);
    EXPECT_EQ(done.bytes, StepBytes(done.step, done.rank == 1 ? 3 : 2));
    EXPECT_TRUE(done.fence.empty());
  }
  EXPECT_TRUE(HostImage(1) == want_host1);
  EXPECT_TRUE(HostImage(3) == want_host3);

  // Back to cleared device pools, into other pages.
  listener_.Clear();
  ASSERT_TRUE(
      runtime_.Memset(pools_->device(1)->backend_data(), 0, DeviceBytes())
          .ok());
  ASSERT_TRUE(
      runtime_.Memset(pools_->device(3)->backend_data(), 0, DeviceBytes())
          .ok());
  const RankCopy in1 = Copy(1, {2, 3, 1}, {4, 0, 2});
  const RankCopy in3 = Copy(3, {1, 3}, {5, 1});
  std::vector<uint8_t> want_device1(DeviceBytes(), 0);
  std::vector<uint8_t> want_device3(DeviceBytes(), 0);
  std::vector<uint8_t> host1 = HostImage(1), host3 = HostImage(3);
  for (uint32_t step = 0; step < steps; ++step) {
    ASSERT_TRUE(engine_
                    ->Submit(TransferTask{.op_id = 2,
                                          .direction = kH2D,
                                          .step = step,
                                          .ranks = {in1, in3}})
                    .ok());
    Model(kH2D, step, in1, want_device1.data(), host1.data());
    Model(kH2D, step, in3, want_device3.data(), host3.data());
  }
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 2 * steps);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(done.bytes, StepBytes(done.step, done.rank == 1 ? 3 : 2));
    EXPECT_EQ(done.fence.size(), cuda::kIpcHandleBytes);
  }
  const std::vector<uint8_t> got1 = DeviceImage(1);
  const std::vector<uint8_t> got3 = DeviceImage(3);
  EXPECT_TRUE(got1 == want_device1);
  EXPECT_TRUE(got3 == want_device3);
  // The round trip: device page 1 of rank 1 went to host 4, then to 2.
  const RankPoolsOptions& o = pools_->options();
  for (uint32_t step = 0; step < steps; ++step) {
    for (const auto& [f, l] : geometry().StepBlocks(step)) {
      const uint64_t from =
          geometry().DeviceOffset(o.device_pages_per_rank, 1, f, l);
      const uint64_t to =
          geometry().DeviceOffset(o.device_pages_per_rank, 2, f, l);
      ASSERT_EQ(std::memcmp(got1.data() + to, source1.data() + from,
                            geometry().BlockBytes(f)),
                0)
          << "step " << step << " family " << f;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    PresetsAndLayouts, RoundTripTest,
    ::testing::Combine(
        ::testing::Values("tiny", "tiny-draft", "deepseek-v3.2-fp8"),
        ::testing::Values(HostLayout::kLayerFirst, HostLayout::kPageFirst)),
    [](const auto& info) {
      std::string name = absl::StrCat(std::get<0>(info.param), "_",
                                      HostLayoutName(std::get<1>(info.param)));
      for (char& c : name) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// --- Launches
// -------------------------------------------------------------------

TEST_F(CudaTransferEngineTest, OneLaunchPerTaskAndRankWithPackedDescriptors) {
  Build(RigConfig{.host_layout = HostLayout::kPageFirst, .max_blocks = 7});
  const uint32_t step = 1;
  ASSERT_TRUE(engine_
                  ->Submit(TransferTask{
                      .op_id = 5,
                      .direction = kH2D,
                      .step = step,
                      .ranks = {Copy(1, {3, 1}, {0, 5}), Copy(3, {2}, {4})}})
                  .ok());
  engine_->Drain();
  const std::vector<RecordingRuntime::Launch> launches = runtime_.launches();
  ASSERT_EQ(launches.size(), 2u);
  const RankPoolsOptions& o = pools_->options();
  const auto blocks = geometry().StepBlocks(step);
  for (const RecordingRuntime::Launch& launch : launches) {
    const bool rank1 = launch.copy.num_pages == 2;
    const Rank rank = rank1 ? 1 : 3;
    EXPECT_EQ(launch.copy.src_base, pools_->host(rank)->backend_data());
    EXPECT_EQ(launch.copy.dst_base, pools_->device(rank)->backend_data());
    EXPECT_EQ(launch.copy.max_blocks, 7);
    ASSERT_EQ(launch.copy.num_regions, static_cast<int32_t>(blocks.size()));
    EXPECT_EQ(launch.src_pages,
              rank1 ? std::vector<int64_t>({0, 5}) : std::vector<int64_t>{4});
    EXPECT_EQ(launch.dst_pages,
              rank1 ? std::vector<int64_t>({3, 1}) : std::vector<int64_t>{2});
    for (size_t i = 0; i < blocks.size(); ++i) {
      const auto [f, l] = blocks[i];
      const cuda::CopyRegion& r = launch.regions[i];
      EXPECT_EQ(
          r.src_offset,
          geometry().HostOffset(o.host_layout, o.host_pages_per_rank, 0, f, l));
      EXPECT_EQ(r.dst_offset,
                geometry().DeviceOffset(o.device_pages_per_rank, 0, f, l));
      EXPECT_EQ(r.bytes_per_page, geometry().BlockBytes(f));
      EXPECT_EQ(r.src_stride, geometry().BytesPerPage());
      EXPECT_EQ(r.dst_stride, geometry().BlockBytes(f));
    }
  }
}

TEST_F(CudaTransferEngineTest, EmptyPageListsAreNoOpAcksWithoutLaunches) {
  ASSERT_TRUE(
      engine_
          ->Submit(TransferTask{.op_id = 9,
                                .direction = kH2D,
                                .step = 0,
                                .ranks = {Copy(1, {}, {}), Copy(3, {}, {})}})
          .ok());
  engine_->Drain();
  EXPECT_TRUE(runtime_.launches().empty());
  ASSERT_EQ(listener_.count(), 2u);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok());
    EXPECT_EQ(done.bytes, 0u);
    EXPECT_EQ(done.op_id, 9u);
  }
}

TEST_F(CudaTransferEngineTest, StagingGrowsForLargeCopies) {
  Build(RigConfig{.preset = "tiny", .device_pages = 700, .host_pages = 700});
  const std::vector<uint8_t> source = FillDevice(1, 5);
  std::vector<uint8_t> device = source;
  std::vector<uint8_t> want = HostImage(1);
  for (int64_t pages : {3, 600, 2, 650}) {
    RankCopy copy{.rank = 1};
    for (int64_t i = 0; i < pages; ++i) {
      copy.device_pages.push_back(699 - i);
      copy.host_pages.push_back((i * 7) % 700);
    }
    for (uint32_t step = 0; step < geometry().NumSteps(); ++step) {
      ASSERT_TRUE(
          engine_
              ->Submit(TransferTask{
                  .op_id = 1, .direction = kD2H, .step = step, .ranks = {copy}})
              .ok());
      Model(kD2H, step, copy, device.data(), want.data());
    }
  }
  engine_->Drain();
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
  }
  EXPECT_TRUE(HostImage(1) == want);
}

// --- Validation
// -------------------------------------------------------------------

TEST_F(CudaTransferEngineTest, ValidationErrorsLeaveNothingQueued) {
  auto fence_event = base().CreateEvent(Device(0), {.interprocess = true});
  ASSERT_TRUE(fence_event.ok());
  auto handle = base().IpcGetEventHandle(*fence_event);
  ASSERT_TRUE(handle.ok());
  auto fence1 = engine_->RegisterFence(1, *handle);
  ASSERT_TRUE(fence1.ok()) << fence1.status();

  const RankCopy good = Copy(1, {1}, {1});
  const std::vector<std::pair<std::string, TransferTask>> bad = {
      {"unserved rank",
       {.op_id = 1, .step = 0, .ranks = {good, Copy(0, {1}, {1})}}},
      {"rank beyond C", {.op_id = 1, .step = 0, .ranks = {Copy(9, {}, {})}}},
      {"list lengths",
       {.op_id = 1, .step = 0, .ranks = {good, Copy(3, {1, 2}, {1})}}},
      {"device page", {.op_id = 1, .step = 0, .ranks = {Copy(3, {4}, {1})}}},
      {"host page", {.op_id = 1, .step = 0, .ranks = {Copy(3, {1}, {6})}}},
      {"negative page", {.op_id = 1, .step = 0, .ranks = {Copy(3, {-1}, {1})}}},
      {"step", {.op_id = 1, .step = geometry().NumSteps(), .ranks = {good}}},
      {"unknown fence",
       {.op_id = 1, .step = 0, .ranks = {good, Copy(3, {1}, {1}, 99)}}},
      {"fence of another rank",
       {.op_id = 1, .step = 0, .ranks = {good, Copy(3, {1}, {1}, *fence1)}}},
  };
  for (const auto& [what, task] : bad) {
    for (TransferDirection direction : {kD2H, kH2D}) {
      TransferTask t = task;
      t.direction = direction;
      absl::Status s = engine_->Submit(t);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << s;
    }
  }
  engine_->Drain();
  EXPECT_EQ(listener_.count(), 0u);
  EXPECT_TRUE(runtime_.launches().empty());
  // The fence's refcount was not taken: releasing destroys it now.
  ASSERT_TRUE(engine_->ReleaseFence(*fence1).ok());
  ASSERT_TRUE(base().DestroyEvent(*fence_event).ok());
}

// --- Ordering, Drain, shutdown
// ----------------------------------------------------

TEST_F(CudaTransferEngineTest, CompletesInSubmissionOrderPerStream) {
  SlowDown(absl::Microseconds(300));
  // The two streams of a rank run concurrently: loads and backups touch
  // disjoint pages (ordering across streams is the cache engine's job).
  for (uint64_t op = 1; op <= 24; ++op) {
    const bool load = op % 3 == 0;
    ASSERT_TRUE(
        engine_
            ->Submit(TransferTask{
                .op_id = op,
                .direction = load ? kH2D : kD2H,
                .step = 0,
                .ranks = {load ? Copy(1, {3}, {4}) : Copy(1, {1}, {2}),
                          load ? Copy(3, {3}, {3}) : Copy(3, {2}, {1})}})
            .ok());
  }
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 48u);
  uint64_t last[4][2] = {};
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok());
    uint64_t& prev = last[done.rank][done.direction == kH2D];
    EXPECT_GT(done.op_id, prev) << "rank " << done.rank;
    prev = done.op_id;
  }
}

// A gate a listener hook blocks on.
class Gate {
 public:
  void Open() {
    MutexLock lock(&mu_);
    open_ = true;
    cv_.SignalAll();
  }
  void Wait() {
    MutexLock lock(&mu_);
    while (!open_) cv_.Wait(&mu_);
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

TEST_F(CudaTransferEngineTest, DrainWaitsUntilTheListenerReturned) {
  engine_->Drain();  // Nothing submitted: returns at once.
  Gate gate;
  engine_.reset();
  listener_.set_hook([&gate](const StepDone&) { gate.Wait(); });
  Build();
  ASSERT_TRUE(engine_
                  ->Submit(TransferTask{.op_id = 1,
                                        .direction = kD2H,
                                        .step = 0,
                                        .ranks = {Copy(1, {1}, {1})}})
                  .ok());
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    engine_->Drain();
    drained = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(drained.load());
  gate.Open();
  drainer.join();
  EXPECT_TRUE(drained.load());
  EXPECT_EQ(listener_.count(), 1u);
}

TEST_F(CudaTransferEngineTest, DestructionDeliversWorkInFlight) {
  const std::vector<uint8_t> source = FillDevice(1, 17);
  std::vector<uint8_t> device = source;
  std::vector<uint8_t> want = HostImage(1);
  SlowDown(absl::Milliseconds(5));
  for (uint32_t step = 0; step < geometry().NumSteps(); ++step) {
    const RankCopy copy = Copy(1, {1, 2}, {3, 4});
    ASSERT_TRUE(engine_
                    ->Submit(TransferTask{.op_id = 1,
                                          .direction = kD2H,
                                          .step = step,
                                          .ranks = {copy, Copy(3, {1}, {1})}})
                    .ok());
    Model(kD2H, step, copy, device.data(), want.data());
  }
  engine_.reset();
  ASSERT_EQ(listener_.count(), 2 * geometry().NumSteps());
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
  }
  EXPECT_TRUE(HostImage(1) == want);
}

TEST_F(CudaTransferEngineTest, ConcurrentSubmitters) {
  Build(RigConfig{.device_pages = 6});
  SlowDown(absl::Microseconds(50));
  // Threads 0 and 1 back up, 2 and 3 load, on disjoint pages.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        EXPECT_TRUE(
            engine_
                ->Submit(TransferTask{
                    .op_id = static_cast<uint64_t>(t * 100 + i),
                    .direction = t < 2 ? kD2H : kH2D,
                    .step = static_cast<uint32_t>(i % geometry().NumSteps()),
                    .ranks = {Copy(1, {1 + t}, {t}), Copy(3, {}, {})}})
                .ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 200u);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
  }
}

TEST_F(CudaTransferEngineTest, RankWithoutDeviceFailsSetupAndItsSteps) {
  auto refused = CudaTransferEngine::Create(
      &runtime_, pools_.get(), &listener_,
      CudaTransferEngineOptions{.device_of_rank = {-1, 0}});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("rank 3"));

  CudaTransferEngine partial(
      &runtime_, pools_.get(), &listener_,
      CudaTransferEngineOptions{.device_of_rank = {-1, 0}});
  EXPECT_FALSE(partial.setup_status().ok());
  EXPECT_TRUE(partial.StreamStatus(1, kD2H).ok());
  EXPECT_FALSE(partial.StreamStatus(3, kH2D).ok());
  ASSERT_TRUE(
      partial
          .Submit(TransferTask{.op_id = 1,
                               .direction = kH2D,
                               .step = 0,
                               .ranks = {Copy(1, {1}, {1}), Copy(3, {1}, {1})}})
          .ok());
  partial.Drain();
  ASSERT_EQ(listener_.count(), 2u);
  for (const StepDone& done : listener_.dones()) {
    if (done.rank == 1) {
      EXPECT_TRUE(done.status.ok()) << done.status;
    } else {
      EXPECT_EQ(done.status.code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_EQ(done.bytes, 0u);
    }
  }
}

}  // namespace
}  // namespace hicache
