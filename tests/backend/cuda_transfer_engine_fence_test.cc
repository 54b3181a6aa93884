// CudaTransferEngine on SimCudaRuntime, or on the GPU with
// HICACHE_CUDA_RUNTIME=real (cuda_engine_rig.h): fences (registration,
// ordering, release, load fences); CUDA failures (injected faults) on the
// simulator only.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/backend/cuda/cuda_transfer_engine.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/backend/cuda_engine_rig.h"
#include "tests/backend/cuda_test_support.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using testing::kD2H;
using testing::kH2D;

// A worker's side of a fence: an interprocess event on its own stream.
struct WorkerEvent {
  cuda::Stream stream = nullptr;
  cuda::Event event = nullptr;
  std::string handle;
};

class CudaFenceTest : public testing::CudaEngineRig {
 protected:
  WorkerEvent MakeWorkerEvent(int sim_device) {
    WorkerEvent w;
    const int device = Device(sim_device);
    auto stream = base().CreateStream(device);
    auto event = base().CreateEvent(device, {.interprocess = true});
    EXPECT_TRUE(stream.ok() && event.ok());
    w.stream = *stream;
    w.event = *event;
    auto handle = base().IpcGetEventHandle(w.event);
    EXPECT_TRUE(handle.ok()) << handle.status();
    w.handle = *handle;
    return w;
  }
  void Destroy(const WorkerEvent& w) {
    EXPECT_TRUE(base().SynchronizeStream(w.stream).ok());
    EXPECT_TRUE(base().DestroyEvent(w.event).ok());
    EXPECT_TRUE(base().DestroyStream(w.stream).ok());
  }
  // True when every block of `step` for `copy` (device to host) matches.
  bool HostMatches(uint32_t step, const RankCopy& copy,
                   const std::vector<uint8_t>& device) {
    std::vector<uint8_t> want = HostImage(copy.rank);
    std::vector<uint8_t> d = device;
    Model(kD2H, step, copy, d.data(), want.data());
    return HostImage(copy.rank) == want;
  }
};

TEST_F(CudaFenceTest, RegistrationAndRelease) {
  const WorkerEvent w = MakeWorkerEvent(0);
  EXPECT_EQ(engine_->RegisterFence(1, w.handle.substr(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->RegisterFence(1, w.handle + "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->RegisterFence(0, w.handle).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->RegisterFence(17, w.handle).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (!real()) {  // A refused open, injected.
    sim_.InjectFault(cuda::SimFault::kIpcOpenEvent, 1,
                     absl::UnavailableError("no ipc"));
    absl::StatusOr<uint64_t> failed = engine_->RegisterFence(1, w.handle);
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(failed.status().message(), HasSubstr("rank 1"));
  }

  auto a = engine_->RegisterFence(1, w.handle);
  auto b = engine_->RegisterFence(1, w.handle);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(*a, 0u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(engine_->FenceRank(*a).value(), 1u);
  EXPECT_EQ(engine_->FenceRank(999).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->ReleaseFence(999).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(engine_->ReleaseFence(*a).ok());
  EXPECT_EQ(engine_->ReleaseFence(*a).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_->FenceRank(*a).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_
                ->Submit(TransferTask{
                    .op_id = 1, .step = 0, .ranks = {Copy(1, {1}, {1}, *a)}})
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine_->FenceRank(*b).ok());
  // *b is destroyed with the engine.
  engine_.reset();
  Destroy(w);
}

// The worker writes the layer on its own (slow) stream and records the
// fence after it; the backup must copy the written bytes, not what was there
// when Submit ran.
TEST_F(CudaFenceTest, CopyStartsAfterTheFencesRecord) {
  const WorkerEvent w = MakeWorkerEvent(0);
  auto fence = engine_->RegisterFence(1, w.handle);
  ASSERT_TRUE(fence.ok()) << fence.status();
  const std::vector<uint8_t> pattern = testing::PatternBytes(DeviceBytes(), 9);
  auto staged = base().HostAllocPinned(DeviceBytes());
  auto scratch = base().HostAllocPinned(128);
  ASSERT_TRUE(staged.ok() && scratch.ok());
  std::memcpy(*staged, pattern.data(), pattern.size());

  std::atomic<bool> fence_done_at_completion{false};
  listener_.set_hook([&](const StepDone&) {
    fence_done_at_completion = base().QueryEvent(w.event).value_or(false);
  });
  SlowDown(absl::Milliseconds(40));
  // Six slow items, then the layer's bytes, then the record.
  char* scratch_bytes = static_cast<char*>(*scratch);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(
        base().MemcpyAsync(scratch_bytes + 64, scratch_bytes, 64, w.stream).ok());
  }
  ASSERT_TRUE(base().MemcpyAsync(pools_->device(1)->backend_data(), *staged,
                               DeviceBytes(), w.stream)
                  .ok());
  ASSERT_TRUE(base().RecordEvent(w.event, w.stream).ok());

  const RankCopy copy = Copy(1, {1, 2, 3}, {0, 5, 2}, *fence);
  ASSERT_TRUE(
      engine_
          ->Submit(TransferTask{
              .op_id = 1, .direction = kD2H, .step = 0, .ranks = {copy}})
          .ok());
  // Released while a step waits on it: still valid for that step.
  ASSERT_TRUE(engine_->ReleaseFence(*fence).ok());
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 1u);
  EXPECT_TRUE(listener_.dones()[0].status.ok()) << listener_.dones()[0].status;
  EXPECT_TRUE(fence_done_at_completion.load());
  EXPECT_TRUE(HostMatches(0, copy, pattern));
  SlowDown(absl::ZeroDuration());
  ASSERT_TRUE(base().HostFreePinned(*staged).ok());
  ASSERT_TRUE(base().HostFreePinned(*scratch).ok());
  Destroy(w);
}

TEST_F(CudaFenceTest, LoadStepsCarryAnOpenableFence) {
  ASSERT_TRUE(
      engine_
          ->Submit(TransferTask{.op_id = 3,
                                .direction = kH2D,
                                .step = 1,
                                .ranks = {Copy(1, {1}, {1}), Copy(3, {}, {})}})
          .ok());
  ASSERT_TRUE(engine_
                  ->Submit(TransferTask{.op_id = 4,
                                        .direction = kD2H,
                                        .step = 1,
                                        .ranks = {Copy(1, {1}, {1})}})
                  .ok());
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 3u);
  for (const StepDone& done : listener_.dones()) {
    ASSERT_TRUE(done.status.ok()) << done.status;
    if (done.direction == kD2H) {
      EXPECT_TRUE(done.fence.empty());
      continue;
    }
    ASSERT_EQ(done.fence.size(), cuda::kIpcHandleBytes);
    const int device = Device(done.rank == 1 ? 0 : 1);
    auto opened = base().IpcOpenEventHandle(device, done.fence);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_TRUE(base().SynchronizeEvent(*opened).ok());
    EXPECT_TRUE(base().DestroyEvent(*opened).ok());
  }
}

// --- Failures
// ---------------------------------------------------------------------

struct FaultCase {
  cuda::SimFault fault;
  const char* name;
  bool sticky;  // Leaves the stream failed.
};

class CudaFaultTest : public CudaFenceTest,
                      public ::testing::WithParamInterface<FaultCase> {};

TEST_P(CudaFaultTest, FailsTheStepAndNeverReportsWrongBytes) {
  SkipUnlessSimulated("injected CUDA faults");
  const FaultCase c = GetParam();
  const std::vector<uint8_t> device1 = FillDevice(1, 21);
  const std::vector<uint8_t> device3 = FillDevice(3, 23);
  const std::vector<uint8_t> host_before = HostImage(1);
  // Every copy waits on a fence (never recorded: complete), so that
  // StreamWaitEvent is on the path.
  const WorkerEvent w = MakeWorkerEvent(0);
  auto fence = engine_->RegisterFence(1, w.handle);
  ASSERT_TRUE(fence.ok());

  sim_.InjectFault(c.fault, 1, absl::InternalError("injected"));
  const RankCopy first = Copy(1, {1, 2}, {0, 1}, *fence);
  ASSERT_TRUE(
      engine_
          ->Submit(TransferTask{
              .op_id = 1, .direction = kD2H, .step = 0, .ranks = {first}})
          .ok());
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 1u);
  const StepDone failed = listener_.dones()[0];
  EXPECT_FALSE(failed.status.ok());
  EXPECT_EQ(failed.bytes, 0u);
  EXPECT_TRUE(failed.fence.empty());
  if (c.fault != cuda::SimFault::kRecordEvent &&
      c.fault != cuda::SimFault::kEventQuery) {
    EXPECT_TRUE(HostImage(1) == host_before) << "destination touched";
  }

  // Later steps on the same stream: fail fast when the stream is broken,
  // else copy correctly. Either way an OK step has exactly the right bytes.
  listener_.Clear();
  const RankCopy second = Copy(1, {3}, {4}, *fence);
  ASSERT_TRUE(
      engine_
          ->Submit(TransferTask{
              .op_id = 2, .direction = kD2H, .step = 1, .ranks = {second}})
          .ok());
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 1u);
  const StepDone next = listener_.dones()[0];
  if (c.sticky) {
    EXPECT_EQ(next.status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(next.status.message(), HasSubstr("earlier error"));
    EXPECT_EQ(next.bytes, 0u);
    EXPECT_FALSE(engine_->StreamStatus(1, kD2H).ok());
  } else {
    ASSERT_TRUE(next.status.ok()) << next.status;
    EXPECT_EQ(next.bytes, StepBytes(1, 1));
    EXPECT_TRUE(engine_->StreamStatus(1, kD2H).ok());
  }

  // Other streams are unaffected: rank 3's backup and rank 1's load.
  listener_.Clear();
  const RankCopy other = Copy(3, {1, 2}, {2, 3});
  ASSERT_TRUE(
      engine_
          ->Submit(TransferTask{
              .op_id = 3, .direction = kD2H, .step = 0, .ranks = {other}})
          .ok());
  ASSERT_TRUE(engine_
                  ->Submit(TransferTask{.op_id = 4,
                                        .direction = kH2D,
                                        .step = 0,
                                        .ranks = {Copy(1, {3}, {5})}})
                  .ok());
  engine_->Drain();
  ASSERT_EQ(listener_.count(), 2u);
  for (const StepDone& done : listener_.dones()) {
    EXPECT_TRUE(done.status.ok()) << done.status;
  }
  EXPECT_TRUE(HostMatches(0, other, device3));
  ASSERT_TRUE(engine_->ReleaseFence(*fence).ok());
  engine_.reset();
  Destroy(w);
}

// Several steps queued behind an asynchronous failure: none is OK with
// wrong bytes.
TEST_F(CudaFenceTest, StepsQueuedBehindAnAsyncFailureFail) {
  SkipUnlessSimulated("an injected asynchronous copy failure");
  const std::vector<uint8_t> device1 = FillDevice(1, 41);
  SlowDown(absl::Milliseconds(2));
  sim_.InjectFault(cuda::SimFault::kAsyncCopy, 1,
                   absl::InternalError("illegal address"));
  for (uint32_t step = 0; step < geometry().NumSteps(); ++step) {
    ASSERT_TRUE(engine_
                    ->Submit(TransferTask{.op_id = 1,
                                          .direction = kD2H,
                                          .step = step,
                                          .ranks = {Copy(1, {1, 2}, {2, 1})}})
                    .ok());
  }
  engine_->Drain();
  ASSERT_EQ(listener_.count(), geometry().NumSteps());
  for (const StepDone& done : listener_.dones()) {
    EXPECT_FALSE(done.status.ok()) << "step " << done.step;
    EXPECT_EQ(done.bytes, 0u);
  }
  EXPECT_THAT(engine_->StreamStatus(1, kD2H).message(),
              HasSubstr("illegal address"));
}

INSTANTIATE_TEST_SUITE_P(
    Faults, CudaFaultTest,
    ::testing::Values(
        FaultCase{cuda::SimFault::kLaunch, "Launch", false},
        FaultCase{cuda::SimFault::kAsyncCopy, "AsyncCopy", true},
        FaultCase{cuda::SimFault::kRecordEvent, "RecordEvent", false},
        FaultCase{cuda::SimFault::kStreamWait, "StreamWait", false},
        // A failed event wait cannot be told from a failed copy: treated as
        // an asynchronous error.
        FaultCase{cuda::SimFault::kEventQuery, "EventQuery", true}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace hicache
