#include "daemon/backend/cuda/sim_cuda_runtime.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/backend/page_copy_cases.h"
#include "tests/testing/subprocess.h"

namespace hicache::cuda {
namespace {

using ::testing::HasSubstr;

class SimCudaRuntimeTest : public ::testing::Test {
 protected:
  Stream NewStream(int device = 0) {
    absl::StatusOr<Stream> stream = runtime_.CreateStream(device);
    EXPECT_TRUE(stream.ok()) << stream.status();
    return *stream;
  }
  Event NewEvent(EventOptions options = {}) {
    absl::StatusOr<Event> event = runtime_.CreateEvent(0, options);
    EXPECT_TRUE(event.ok()) << event.status();
    return *event;
  }
  void* Pinned(size_t bytes) {
    absl::StatusOr<void*> ptr = runtime_.HostAllocPinned(bytes);
    EXPECT_TRUE(ptr.ok()) << ptr.status();
    return *ptr;
  }

  SimCudaRuntime runtime_;
};

TEST_F(SimCudaRuntimeTest, DescribesItsDevices) {
  SimCudaRuntime two(
      {.devices = 2, .device_total_bytes = 1 << 20, .multiprocessors = 7});
  EXPECT_EQ(two.name(), "simulated");
  EXPECT_EQ(*two.DeviceCount(), 2);
  absl::StatusOr<DeviceInfo> info = two.GetDeviceInfo(1);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->total_bytes, 1u << 20);
  EXPECT_EQ(info->free_bytes, 1u << 20);
  EXPECT_EQ(info->multiprocessors, 7);
  EXPECT_EQ(info->pci_bus_id, "0000:02:00.0");
  EXPECT_EQ(two.GetDeviceInfo(2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(two.CreateStream(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SimCudaRuntimeTest, CountsDeviceMemoryAndRefusesBeyondCapacity) {
  SimCudaRuntime small({.device_total_bytes = 1 << 20});
  absl::StatusOr<void*> a = small.DeviceMalloc(0, 600 << 10);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(small.GetDeviceInfo(0)->free_bytes, (1u << 20) - (600u << 10));
  EXPECT_EQ(small.DeviceMalloc(0, 600 << 10).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Far beyond any RAM: refused without touching memory.
  EXPECT_EQ(runtime_.DeviceMalloc(0, 1ull << 50).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(small.DeviceFree(1, *a).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(small.DeviceFree(0, *a).ok());
  EXPECT_EQ(small.GetDeviceInfo(0)->free_bytes, 1u << 20);
  EXPECT_EQ(small.DeviceFree(0, *a).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SimCudaRuntimeTest, SyncCopiesAndMemset) {
  absl::StatusOr<void*> d = runtime_.DeviceMalloc(0, 64);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(runtime_.Memset(*d, 0xab, 64).ok());
  std::vector<uint8_t> out(64);
  ASSERT_TRUE(runtime_.CopyToHost(out.data(), *d, 64).ok());
  EXPECT_EQ(out, std::vector<uint8_t>(64, 0xab));
  const std::vector<uint8_t> in(64, 7);
  ASSERT_TRUE(runtime_.CopyToDevice(*d, in.data(), 64).ok());
  ASSERT_TRUE(runtime_.CopyToHost(out.data(), *d, 64).ok());
  EXPECT_EQ(out, in);
  EXPECT_TRUE(runtime_.DeviceFree(0, *d).ok());
}

TEST_F(SimCudaRuntimeTest, HostRegistrationAndPinnedMemory) {
  std::vector<char> buffer(4096);
  ASSERT_TRUE(runtime_.HostRegister(buffer.data(), 4096).ok());
  EXPECT_EQ(runtime_.HostRegister(buffer.data(), 4096).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(runtime_.HostRegister(buffer.data() + 100, 8).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(runtime_.HostUnregister(buffer.data() + 100).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(runtime_.HostUnregister(buffer.data()).ok());
  EXPECT_EQ(runtime_.HostUnregister(buffer.data()).code(),
            absl::StatusCode::kNotFound);
  for (size_t bytes : {1, 100, 4096}) {
    void* pinned = Pinned(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned) % 64, 0u);
    std::memset(pinned, 1, bytes);
    EXPECT_TRUE(runtime_.HostFreePinned(pinned).ok());
  }
  EXPECT_EQ(runtime_.HostFreePinned(buffer.data()).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SimCudaRuntimeTest, StreamRunsWorkInOrder) {
  runtime_.SetWorkDelay(absl::Milliseconds(1));
  Stream stream = NewStream();
  // A chain a[i] <- a[i - 1] yields 42 everywhere only if run in order.
  constexpr int kN = 50;
  std::vector<int> a(kN, 0);
  a[0] = 42;
  for (int i = 1; i < kN; ++i) {
    ASSERT_TRUE(
        runtime_.MemcpyAsync(&a[i], &a[i - 1], sizeof(int), stream).ok());
  }
  Event done = NewEvent();
  ASSERT_TRUE(runtime_.RecordEvent(done, stream).ok());
  EXPECT_FALSE(*runtime_.QueryEvent(done));  // Asynchronous.
  ASSERT_TRUE(runtime_.SynchronizeEvent(done).ok());
  EXPECT_TRUE(*runtime_.QueryEvent(done));
  EXPECT_EQ(a, std::vector<int>(kN, 42));
  EXPECT_EQ(runtime_.memcpys(), kN - 1);
}

TEST_F(SimCudaRuntimeTest, NeverRecordedEventIsComplete) {
  Event event = NewEvent();
  EXPECT_TRUE(*runtime_.QueryEvent(event));
  EXPECT_TRUE(runtime_.SynchronizeEvent(event).ok());
  Stream stream = NewStream();
  ASSERT_TRUE(runtime_.StreamWaitEvent(stream, event).ok());
  EXPECT_TRUE(runtime_.SynchronizeStream(stream).ok());
}

TEST_F(SimCudaRuntimeTest, StreamWaitEventOrdersWorkAcrossStreams) {
  runtime_.SetWorkDelay(absl::Milliseconds(20));
  Stream producer = NewStream();
  Stream consumer = NewStream();
  int source = 7, staged = 0, result = 0;
  Event ready = NewEvent();
  ASSERT_TRUE(
      runtime_.MemcpyAsync(&staged, &source, sizeof(int), producer).ok());
  ASSERT_TRUE(runtime_.RecordEvent(ready, producer).ok());
  ASSERT_TRUE(runtime_.StreamWaitEvent(consumer, ready).ok());
  ASSERT_TRUE(
      runtime_.MemcpyAsync(&result, &staged, sizeof(int), consumer).ok());
  // A later record does not change what the consumer already waits for.
  Event consumed = NewEvent();
  ASSERT_TRUE(runtime_.RecordEvent(consumed, consumer).ok());
  ASSERT_TRUE(runtime_.SynchronizeEvent(consumed).ok());
  EXPECT_EQ(result, 7);
  EXPECT_TRUE(*runtime_.QueryEvent(ready));
}

TEST_F(SimCudaRuntimeTest, WaitUsesTheRecordAtTheTimeOfTheCall) {
  runtime_.SetWorkDelay(absl::Milliseconds(5));
  Stream a = NewStream();
  Stream b = NewStream();
  Event event = NewEvent();
  ASSERT_TRUE(runtime_.RecordEvent(event, a).ok());
  ASSERT_TRUE(runtime_.SynchronizeEvent(event).ok());
  // Block stream a behind a long queue, then re-record: b's earlier wait
  // must not wait for that later record.
  ASSERT_TRUE(runtime_.StreamWaitEvent(b, event).ok());
  std::vector<int> scratch(200);
  for (int i = 1; i < 200; ++i) {
    ASSERT_TRUE(runtime_.MemcpyAsync(&scratch[i], &scratch[i - 1], 4, a).ok());
  }
  ASSERT_TRUE(runtime_.RecordEvent(event, a).ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(runtime_.SynchronizeStream(b).ok());
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_FALSE(*runtime_.QueryEvent(event));
  ASSERT_TRUE(runtime_.SynchronizeStream(a).ok());
}

TEST_F(SimCudaRuntimeTest, AsyncErrorsAreStickyForTheStream) {
  Stream stream = NewStream();
  int src = 1, dst = 0, later = 0;
  runtime_.InjectFault(SimFault::kAsyncCopy, 1,
                       absl::DataLossError("copy engine on fire"));
  ASSERT_TRUE(runtime_.MemcpyAsync(&dst, &src, sizeof(int), stream).ok());
  ASSERT_TRUE(runtime_.MemcpyAsync(&later, &src, sizeof(int), stream).ok());
  Event event = NewEvent();
  ASSERT_TRUE(runtime_.RecordEvent(event, stream).ok());
  EXPECT_EQ(runtime_.SynchronizeEvent(event).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(runtime_.QueryEvent(event).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(runtime_.SynchronizeStream(stream).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(dst, 0);    // The failed copy touched nothing...
  EXPECT_EQ(later, 0);  // ...and later work of the stream is skipped.
  // Every later record reports it; so does a stream that waits for it.
  Event again = NewEvent();
  ASSERT_TRUE(runtime_.RecordEvent(again, stream).ok());
  EXPECT_EQ(runtime_.SynchronizeEvent(again).code(),
            absl::StatusCode::kDataLoss);
  Stream waiter = NewStream();
  ASSERT_TRUE(runtime_.StreamWaitEvent(waiter, again).ok());
  EXPECT_EQ(runtime_.SynchronizeStream(waiter).code(),
            absl::StatusCode::kDataLoss);
  // Other streams are unaffected; ResetStream recovers.
  Stream other = NewStream();
  ASSERT_TRUE(runtime_.MemcpyAsync(&later, &src, sizeof(int), other).ok());
  EXPECT_TRUE(runtime_.SynchronizeStream(other).ok());
  EXPECT_EQ(later, 1);
  ASSERT_TRUE(runtime_.ResetStream(stream).ok());
  ASSERT_TRUE(runtime_.MemcpyAsync(&dst, &src, sizeof(int), stream).ok());
  ASSERT_TRUE(runtime_.RecordEvent(event, stream).ok());
  EXPECT_TRUE(runtime_.SynchronizeEvent(event).ok());
  EXPECT_EQ(dst, 1);
}

TEST_F(SimCudaRuntimeTest, SynchronousFaults) {
  Stream stream = NewStream();
  Event event = NewEvent();
  runtime_.InjectFault(SimFault::kDeviceMalloc, 2);
  EXPECT_EQ(runtime_.DeviceMalloc(0, 64).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(runtime_.DeviceMalloc(0, 64).status().code(),
            absl::StatusCode::kInternal);
  absl::StatusOr<void*> third = runtime_.DeviceMalloc(0, 64);
  ASSERT_TRUE(third.ok());  // Only the next two failed.
  EXPECT_TRUE(runtime_.DeviceFree(0, *third).ok());

  std::vector<char> buffer(64);
  runtime_.InjectFault(SimFault::kHostRegister, 1,
                       absl::ResourceExhaustedError("no pinned memory"));
  EXPECT_EQ(runtime_.HostRegister(buffer.data(), 64).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(runtime_.HostRegister(buffer.data(), 64).ok());
  EXPECT_TRUE(runtime_.HostUnregister(buffer.data()).ok());

  runtime_.InjectFault(SimFault::kRecordEvent);
  EXPECT_EQ(runtime_.RecordEvent(event, stream).code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(*runtime_.QueryEvent(event));  // Nothing was recorded.

  runtime_.InjectFault(SimFault::kStreamWait);
  EXPECT_EQ(runtime_.StreamWaitEvent(stream, event).code(),
            absl::StatusCode::kInternal);

  runtime_.InjectFault(SimFault::kEventQuery, 2);
  EXPECT_EQ(runtime_.QueryEvent(event).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(runtime_.SynchronizeEvent(event).code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(runtime_.SynchronizeEvent(event).ok());

  Event ipc = NewEvent({.interprocess = true});
  absl::StatusOr<std::string> handle = runtime_.IpcGetEventHandle(ipc);
  ASSERT_TRUE(handle.ok());
  runtime_.InjectFault(SimFault::kIpcOpenEvent);
  EXPECT_EQ(runtime_.IpcOpenEventHandle(0, *handle).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(runtime_.IpcOpenEventHandle(0, *handle).ok());

  runtime_.InjectFault(SimFault::kRecordEvent, 5);
  runtime_.InjectFault(SimFault::kRecordEvent, 0);  // Cleared.
  EXPECT_TRUE(runtime_.RecordEvent(event, stream).ok());
  EXPECT_TRUE(runtime_.SynchronizeStream(stream).ok());
}

TEST_F(SimCudaRuntimeTest, RecordNeedsStreamAndEventOnOneDevice) {
  SimCudaRuntime two({.devices = 2});
  absl::StatusOr<Stream> stream = two.CreateStream(1);
  absl::StatusOr<Event> event = two.CreateEvent(0, {});
  ASSERT_TRUE(stream.ok() && event.ok());
  EXPECT_EQ(two.RecordEvent(*event, *stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(two.StreamWaitEvent(*stream, *event).ok());  // Cross-device ok.
  EXPECT_EQ(two.SynchronizeStream(nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SimCudaRuntimeTest, ElapsedMsBetweenTimingEvents) {
  Stream stream = NewStream();
  Event start = NewEvent({.timing = true});
  Event end = NewEvent({.timing = true});
  Event plain = NewEvent();
  EXPECT_EQ(runtime_.ElapsedMs(start, end).status().code(),
            absl::StatusCode::kInvalidArgument);  // Never recorded.
  runtime_.SetWorkDelay(absl::Milliseconds(10));
  ASSERT_TRUE(runtime_.RecordEvent(start, stream).ok());
  ASSERT_TRUE(runtime_.RecordEvent(plain, stream).ok());
  ASSERT_TRUE(runtime_.RecordEvent(end, stream).ok());
  ASSERT_TRUE(runtime_.SynchronizeEvent(end).ok());
  absl::StatusOr<float> ms = runtime_.ElapsedMs(start, end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 15.0f);  // Two delayed items between the markers' runs.
  EXPECT_LT(*ms, 5000.0f);
  EXPECT_EQ(runtime_.ElapsedMs(start, plain).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_.CreateEvent(0, {.interprocess = true, .timing = true})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SimCudaRuntimeTest, IpcEventHandleAliasesTheEvent) {
  Event event = NewEvent({.interprocess = true});
  EXPECT_EQ(runtime_.IpcGetEventHandle(NewEvent()).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> handle = runtime_.IpcGetEventHandle(event);
  ASSERT_TRUE(handle.ok());
  EXPECT_EQ(handle->size(), kIpcHandleBytes);
  // Another runtime of the same process (a "client") opens it.
  SimCudaRuntime client;
  absl::StatusOr<Event> alias = client.IpcOpenEventHandle(0, *handle);
  ASSERT_TRUE(alias.ok()) << alias.status();
  runtime_.SetWorkDelay(absl::Milliseconds(20));
  Stream stream = NewStream();
  ASSERT_TRUE(runtime_.RecordEvent(event, stream).ok());
  EXPECT_FALSE(*client.QueryEvent(*alias));
  EXPECT_TRUE(client.SynchronizeEvent(*alias).ok());
  EXPECT_TRUE(*runtime_.QueryEvent(event));
  // The alias can be recorded too; the original sees it.
  absl::StatusOr<Stream> client_stream = client.CreateStream(0);
  ASSERT_TRUE(client_stream.ok());
  ASSERT_TRUE(client.RecordEvent(*alias, *client_stream).ok());
  EXPECT_TRUE(runtime_.SynchronizeEvent(event).ok());
  EXPECT_TRUE(client.DestroyEvent(*alias).ok());

  // A handle from another process.
  std::string foreign = *handle;
  foreign[16] ^= 0x55;  // The pid field.
  absl::Status status = client.IpcOpenEventHandle(0, foreign).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("process"));
  EXPECT_EQ(client.IpcOpenEventHandle(0, "short").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Gone once the exporter destroys it.
  ASSERT_TRUE(runtime_.DestroyEvent(event).ok());
  EXPECT_EQ(client.IpcOpenEventHandle(0, *handle).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SimCudaRuntimeTest, IpcMemHandleMapsTheSameBytes) {
  absl::StatusOr<void*> device = runtime_.DeviceMalloc(0, 1 << 16);
  ASSERT_TRUE(device.ok());
  absl::StatusOr<std::string> handle =
      runtime_.IpcGetMemHandle(static_cast<char*>(*device) + 100);
  ASSERT_TRUE(handle.ok()) << handle.status();
  EXPECT_EQ(handle->size(), kIpcHandleBytes);
  SimCudaRuntime client;
  absl::StatusOr<void*> mapped = client.IpcOpenMemHandle(0, *handle);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_NE(*mapped, *device);
  static_cast<char*>(*device)[5000] = 'x';
  EXPECT_EQ(static_cast<char*>(*mapped)[5000], 'x');
  static_cast<char*>(*mapped)[7] = 'y';
  EXPECT_EQ(static_cast<char*>(*device)[7], 'y');
  EXPECT_TRUE(client.IpcCloseMemHandle(*mapped).ok());
  EXPECT_EQ(client.IpcCloseMemHandle(*mapped).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<char> host(8);
  EXPECT_EQ(runtime_.IpcGetMemHandle(host.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runtime_.DeviceFree(0, *device).ok());
  EXPECT_EQ(client.IpcOpenMemHandle(0, *handle).status().code(),
            absl::StatusCode::kNotFound);  // Unlinked by DeviceFree.
}

// The child half of IpcMemHandleWorksAcrossProcesses.
TEST(SimCudaRuntimeChildTest, WritesThroughIpcHandle) {
  const char* hex = std::getenv("HICACHE_SIM_IPC_HANDLE");
  if (hex == nullptr) GTEST_SKIP() << "run by IpcMemHandleWorksAcrossProcesses";
  SimCudaRuntime runtime;
  absl::StatusOr<void*> mapped =
      runtime.IpcOpenMemHandle(0, absl::HexStringToBytes(hex));
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ(static_cast<char*>(*mapped)[0], 'p');
  std::memcpy(*mapped, "child", 5);
  EXPECT_TRUE(runtime.IpcCloseMemHandle(*mapped).ok());
}

TEST_F(SimCudaRuntimeTest, IpcMemHandleWorksAcrossProcesses) {
  absl::StatusOr<void*> device = runtime_.DeviceMalloc(0, 4096);
  ASSERT_TRUE(device.ok());
  static_cast<char*>(*device)[0] = 'p';
  absl::StatusOr<std::string> handle = runtime_.IpcGetMemHandle(*device);
  ASSERT_TRUE(handle.ok());
  // This test binary again, running only the child half, without the
  // files the test runner gave this process.
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  absl::StatusOr<hicache::testing::Subprocess> process =
      hicache::testing::Subprocess::Start(
          {"/usr/bin/env", "-u", "TEST_PREMATURE_EXIT_FILE", "-u",
           "XML_OUTPUT_FILE",
           absl::StrCat("HICACHE_SIM_IPC_HANDLE=",
                        absl::BytesToHexString(*handle)),
           self,
           "--gtest_filter=SimCudaRuntimeChildTest.WritesThroughIpcHandle"});
  ASSERT_TRUE(process.ok()) << process.status();
  absl::StatusOr<int> exit_code = process->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  ASSERT_EQ(*exit_code, 0) << process->Stdout() << process->Stderr();
  EXPECT_THAT(process->Stdout(),
              HasSubstr("[       OK ] SimCudaRuntimeChildTest"));
  EXPECT_EQ(std::string(static_cast<char*>(*device), 5), "child");
  EXPECT_TRUE(runtime_.DeviceFree(0, *device).ok());
}

TEST_F(SimCudaRuntimeTest, DestroyingAStreamDrainsIt) {
  runtime_.SetWorkDelay(absl::Milliseconds(5));
  Stream stream = NewStream();
  std::vector<int> a(20, 0);
  a[0] = 3;
  for (int i = 1; i < 20; ++i) {
    ASSERT_TRUE(runtime_.MemcpyAsync(&a[i], &a[i - 1], 4, stream).ok());
  }
  ASSERT_TRUE(runtime_.DestroyStream(stream).ok());
  EXPECT_EQ(a, std::vector<int>(20, 3));
  EXPECT_EQ(runtime_.DestroyStream(stream).code(),
            absl::StatusCode::kInvalidArgument);
}

// --- Page copies -------------------------------------------------------------

class SimPageCopyTest : public ::testing::TestWithParam<testing::PageCopyCase> {
};

TEST_P(SimPageCopyTest, CopiesExactlyLikeTheReference) {
  SimCudaRuntime runtime;
  testing::CheckPageCopy(runtime, 0, GetParam());
  EXPECT_EQ(runtime.launches(), 1);
}

INSTANTIATE_TEST_SUITE_P(AllRowsAndLayouts, SimPageCopyTest,
                         ::testing::ValuesIn(testing::AllPageCopyCases()),
                         testing::PageCopyCaseName);

// A one-region copy of 4 pages of `row` bytes between two registered
// buffers, with pinned descriptors.
class SimLaunchTest : public SimCudaRuntimeTest {
 protected:
  void SetUp() override {
    src_.assign(kPages * kRow, 0);
    dst_.assign(kPages * kRow, 0);
    for (size_t i = 0; i < src_.size(); ++i) src_[i] = static_cast<uint8_t>(i);
    ASSERT_TRUE(runtime_.HostRegister(src_.data(), src_.size()).ok());
    ASSERT_TRUE(runtime_.HostRegister(dst_.data(), dst_.size()).ok());
    descriptors_ = Pinned(PackedCopyBytes(1, kPages));
    Pack(
        CopyRegion{
            .bytes_per_page = kRow, .src_stride = kRow, .dst_stride = kRow},
        {0, 1, 2, 3}, {3, 2, 1, 0});
    stream_ = NewStream();
  }
  void Pack(CopyRegion region, std::vector<int64_t> src_pages,
            std::vector<int64_t> dst_pages) {
    testing::PackDescriptors({region}, src_pages, dst_pages, descriptors_);
  }
  BatchedPageCopy Copy() {
    return BatchedPageCopy{.src_base = src_.data(),
                           .dst_base = dst_.data(),
                           .descriptors = descriptors_,
                           .num_regions = 1,
                           .num_pages = kPages};
  }
  // Nothing was enqueued: no launch counted and dst untouched after a sync.
  void ExpectNothingEnqueued(int64_t launches_before) {
    ASSERT_TRUE(runtime_.SynchronizeStream(stream_).ok());
    EXPECT_EQ(runtime_.launches(), launches_before);
    EXPECT_EQ(dst_, std::vector<uint8_t>(dst_.size(), 0));
  }

  static constexpr int64_t kPages = 4;
  static constexpr uint64_t kRow = 132;
  std::vector<uint8_t> src_, dst_;
  void* descriptors_ = nullptr;
  Stream stream_ = nullptr;
};

TEST_F(SimLaunchTest, CopiesAndCountsLaunches) {
  ASSERT_TRUE(runtime_.LaunchPageCopy(Copy(), stream_).ok());
  ASSERT_TRUE(runtime_.SynchronizeStream(stream_).ok());
  EXPECT_EQ(runtime_.launches(), 1);
  for (int64_t p = 0; p < kPages; ++p) {
    EXPECT_EQ(0, std::memcmp(&dst_[(3 - p) * kRow], &src_[p * kRow], kRow));
  }
  // An empty copy is no launch.
  BatchedPageCopy empty = Copy();
  empty.num_pages = 0;
  EXPECT_TRUE(runtime_.LaunchPageCopy(empty, stream_).ok());
  EXPECT_EQ(runtime_.launches(), 1);
}

TEST_F(SimLaunchTest, InvalidRegionsLeaveNothingEnqueued) {
  struct Bad {
    const char* name;
    CopyRegion region;
    const char* message;
  };
  const Bad bad[] = {
      {"size not a multiple of 4",
       {.bytes_per_page = 130, .src_stride = 132, .dst_stride = 132},
       "multiple of 4"},
      {"zero size",
       {.bytes_per_page = 0, .src_stride = 4, .dst_stride = 4},
       "bytes_per_page"},
      {"src stride below size",
       {.bytes_per_page = 132, .src_stride = 128, .dst_stride = 132},
       "src_stride"},
      {"dst stride below size",
       {.bytes_per_page = 132, .src_stride = 132, .dst_stride = 64},
       "dst_stride"},
      {"stride not a multiple of 4",
       {.bytes_per_page = 132, .src_stride = 134, .dst_stride = 132},
       "src_stride"},
      {"offset not a multiple of 4",
       {.dst_offset = 2, .bytes_per_page = 4, .src_stride = 4, .dst_stride = 4},
       "dst_offset"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    Pack(b.region, {0, 1, 2, 3}, {0, 1, 2, 3});
    absl::Status status = runtime_.LaunchPageCopy(Copy(), stream_);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(b.message));
    ExpectNothingEnqueued(0);
  }
}

TEST_F(SimLaunchTest, BadPointersLeaveNothingEnqueued) {
  for (int which = 0; which < 3; ++which) {
    BatchedPageCopy copy = Copy();
    if (which == 0) copy.src_base = nullptr;
    if (which == 1) copy.dst_base = nullptr;
    if (which == 2) copy.descriptors = nullptr;
    EXPECT_EQ(runtime_.LaunchPageCopy(copy, stream_).code(),
              absl::StatusCode::kInvalidArgument);
  }
  BatchedPageCopy misaligned = Copy();
  misaligned.dst_base = dst_.data() + 2;
  EXPECT_EQ(runtime_.LaunchPageCopy(misaligned, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  // Descriptors in memory the device cannot reach.
  std::vector<int64_t> pageable(PackedCopyBytes(1, kPages) / 8 + 1);
  std::memcpy(pageable.data(), descriptors_, PackedCopyBytes(1, kPages));
  BatchedPageCopy unreachable = Copy();
  unreachable.descriptors = pageable.data();
  absl::Status status = runtime_.LaunchPageCopy(unreachable, stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("device-accessible"));
  BatchedPageCopy negative = Copy();
  negative.num_pages = -1;
  EXPECT_EQ(runtime_.LaunchPageCopy(negative, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_.LaunchPageCopy(Copy(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectNothingEnqueued(0);
  // Null regions are fine when there is nothing to copy.
  EXPECT_TRUE(ValidateRegions(nullptr, 3, 0).ok());
  EXPECT_EQ(ValidateRegions(nullptr, 3, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SimLaunchTest, LaunchFaultEnqueuesNothing) {
  runtime_.InjectFault(SimFault::kLaunch, 1,
                       absl::UnavailableError("launch refused"));
  EXPECT_EQ(runtime_.LaunchPageCopy(Copy(), stream_).code(),
            absl::StatusCode::kUnavailable);
  ExpectNothingEnqueued(0);
  EXPECT_TRUE(runtime_.LaunchPageCopy(Copy(), stream_).ok());
  EXPECT_TRUE(runtime_.SynchronizeStream(stream_).ok());
}

TEST_F(SimLaunchTest, AsyncFaultFailsTheStreamAndLeavesDstUntouched) {
  runtime_.InjectFault(SimFault::kAsyncCopy);
  ASSERT_TRUE(runtime_.LaunchPageCopy(Copy(), stream_).ok());
  EXPECT_EQ(runtime_.launches(), 1);  // Accepted...
  Event event = NewEvent();
  ASSERT_TRUE(runtime_.RecordEvent(event, stream_).ok());
  EXPECT_EQ(runtime_.SynchronizeEvent(event).code(),
            absl::StatusCode::kInternal);  // ...but failed when it ran.
  EXPECT_EQ(dst_, std::vector<uint8_t>(dst_.size(), 0));
}

TEST_F(SimLaunchTest, ReadsDescriptorsWhenTheWorkRuns) {
  runtime_.SetWorkDelay(absl::Milliseconds(100));
  ASSERT_TRUE(runtime_.LaunchPageCopy(Copy(), stream_).ok());
  // Changed after the launch, before the work ran: the change counts.
  Pack(
      CopyRegion{
          .bytes_per_page = kRow, .src_stride = kRow, .dst_stride = kRow},
      {0, 0, 0, 0}, {0, 1, 2, 3});
  ASSERT_TRUE(runtime_.SynchronizeStream(stream_).ok());
  for (int64_t p = 0; p < kPages; ++p) {
    EXPECT_EQ(0, std::memcmp(&dst_[p * kRow], &src_[0], kRow)) << p;
  }
}

TEST_F(SimLaunchTest, OutOfBoundsPageFailsTheStream) {
  Pack(
      CopyRegion{
          .bytes_per_page = kRow, .src_stride = kRow, .dst_stride = kRow},
      {0, 1, 2, 3}, {0, 1, 2, 4});  // Page 4 is past dst's end.
  ASSERT_TRUE(runtime_.LaunchPageCopy(Copy(), stream_).ok());
  absl::Status status = runtime_.SynchronizeStream(stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("illegal address"));
  Pack(
      CopyRegion{
          .bytes_per_page = kRow, .src_stride = kRow, .dst_stride = kRow},
      {-1, 1, 2, 3}, {0, 1, 2, 3});
  ASSERT_TRUE(runtime_.ResetStream(stream_).ok());
  ASSERT_TRUE(runtime_.LaunchPageCopy(Copy(), stream_).ok());
  EXPECT_THAT(runtime_.SynchronizeStream(stream_).message(),
              HasSubstr("illegal address"));
}

}  // namespace
}  // namespace hicache::cuda
