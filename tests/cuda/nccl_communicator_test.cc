// NcclCommunicator (a CP group's link over NCCL, docs/cp-groups.md). What
// needs no GPU runs everywhere: option checks, and a clear UNAVAILABLE when
// NCCL is not compiled in or no GPU is there. With a GPU (tools/gpu_check),
// two processes link over GPU 0 (distinct NCCL_HOSTIDs, so that NCCL accepts
// two ranks on one GPU and talks over the loopback socket): frames of every
// size echo back intact and in order, small-frame round trips are timed, and
// the survivor of a closed end fails within its receive timeout.
#include "daemon/backend/cuda/nccl_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/backend/cuda/real_cuda_runtime.h"
#include "daemon/core/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace hicache {
namespace {

NcclCommunicator::Options BaseOptions() {
  NcclCommunicator::Options options;
  options.peer_name = "test peer";
  options.receive_timeout = absl::Seconds(10);
  return options;
}

TEST(NcclCommunicatorTest, RefusesBadOptions) {
  NcclCommunicator::Options side = BaseOptions();
  side.side = 2;
  EXPECT_EQ(NcclCommunicator::Connect(side).status().code(),
            absl::StatusCode::kInvalidArgument);
  NcclCommunicator::Options tiny = BaseOptions();
  tiny.message_bytes = 16;
  EXPECT_EQ(NcclCommunicator::Connect(tiny).status().code(),
            absl::StatusCode::kInvalidArgument);
  NcclCommunicator::Options timeout = BaseOptions();
  timeout.receive_timeout = absl::ZeroDuration();
  EXPECT_EQ(NcclCommunicator::Connect(timeout).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NcclCommunicatorTest, WithoutNcclItSaysSo) {
  if (NcclCommunicator::Compiled()) GTEST_SKIP() << "NCCL is compiled in";
  const absl::Status status = NcclCommunicator::Connect(BaseOptions()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("not compiled"), std::string::npos)
      << status;
  EXPECT_EQ(NcclCommunicator::NewUniqueIds().status().code(),
            absl::StatusCode::kUnavailable);
}

int GpuCount() {
  cuda::RealCudaRuntime runtime;
  absl::StatusOr<int> count = runtime.DeviceCount();
  return count.ok() ? *count : 0;
}

// NCCL compiled in but no GPU (CI): the link is UNAVAILABLE at once, naming
// the GPU, and nothing blocks waiting for a peer.
TEST(NcclCommunicatorTest, WithoutAGpuConnectIsUnavailable) {
  if (!NcclCommunicator::Compiled()) GTEST_SKIP() << "NCCL not compiled in";
  if (GpuCount() > 0) GTEST_SKIP() << "a GPU is present";
  absl::StatusOr<NcclCommunicator::UniqueIds> ids =
      NcclCommunicator::NewUniqueIds();
  if (!ids.ok()) {
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kUnavailable);
    return;
  }
  NcclCommunicator::Options options = BaseOptions();
  options.ids = *ids;
  const absl::Status status = NcclCommunicator::Connect(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("GPU 0"), std::string::npos) << status;
}

// One side of the two-process test; runs only when the parent sets
// HICACHE_NCCL_PEER_SIDE (and the ids).
TEST(NcclPeer, Run) {
  const char* side_env = std::getenv("HICACHE_NCCL_PEER_SIDE");
  if (side_env == nullptr) GTEST_SKIP() << "run by TwoProcessesLinkOverGpu0";
  NcclCommunicator::Options options = BaseOptions();
  options.side = std::atoi(side_env);
  options.peer_name = absl::StrCat("side ", 1 - options.side);
  options.receive_timeout = absl::Seconds(5);
  std::string forward, backward;
  ASSERT_TRUE(absl::Base64Unescape(std::getenv("HICACHE_NCCL_FORWARD_ID"),
                                   &forward));
  ASSERT_TRUE(absl::Base64Unescape(std::getenv("HICACHE_NCCL_BACKWARD_ID"),
                                   &backward));
  ASSERT_EQ(forward.size(), 128u);
  ASSERT_EQ(backward.size(), 128u);
  std::copy(forward.begin(), forward.end(), options.ids.forward.begin());
  std::copy(backward.begin(), backward.end(), options.ids.backward.begin());
  auto link = NcclCommunicator::Connect(options);
  ASSERT_TRUE(link.ok()) << link.status();

  Mutex mu;
  std::vector<std::string> received;
  CondVar arrived;
  std::promise<absl::Status> failed;
  NcclCommunicator* end = link->get();
  ASSERT_TRUE((*link)
                  ->Start(
                      [&](absl::string_view frame) {
                        if (options.side == 1) {
                          (void)end->Send(std::string(frame));  // Echo.
                          return;
                        }
                        MutexLock lock(&mu);
                        received.emplace_back(frame);
                        arrived.SignalAll();
                      },
                      [&](const absl::Status& cause) {
                        failed.set_value(cause);
                      })
                  .ok());
  if (options.side == 1) {
    // Echo until side 0 closes its end: then this end fails on its own.
    const absl::Status cause = failed.get_future().get();
    EXPECT_FALSE(cause.ok());
    std::printf("side 1 failed as expected: %s\n", cause.ToString().c_str());
    return;
  }
  // Side 0: frames of every size, then timed small round trips.
  std::vector<std::string> sent;
  for (size_t size : {size_t{0}, size_t{1}, size_t{63}, size_t{4096},
                      size_t{65536}, size_t{1} << 20}) {
    std::string frame(size, '\0');
    for (size_t i = 0; i < size; ++i) frame[i] = static_cast<char>(i * 7 + size);
    sent.push_back(frame);
    ASSERT_TRUE(end->Send(frame).ok());
  }
  std::vector<double> rtt_us;
  for (int i = 0; i < 200; ++i) {
    const std::string frame = absl::StrCat("ping ", i);
    sent.push_back(frame);
    const absl::Time start = absl::Now();
    ASSERT_TRUE(end->Send(frame).ok());
    MutexLock lock(&mu);
    while (received.size() < sent.size()) {
      ASSERT_FALSE(arrived.WaitWithTimeout(&mu, absl::Seconds(10)))
          << "no echo of frame " << sent.size() - 1;
    }
    rtt_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  {
    MutexLock lock(&mu);
    EXPECT_EQ(received, sent);
  }
  std::sort(rtt_us.begin(), rtt_us.end());
  std::printf("NCCL link round trip: p50 %.1f us, p99 %.1f us (%zu)\n",
              rtt_us[rtt_us.size() / 2], rtt_us[rtt_us.size() * 99 / 100],
              rtt_us.size());
}

TEST(NcclCommunicatorTest, TwoProcessesLinkOverGpu0) {
  if (!NcclCommunicator::Compiled()) GTEST_SKIP() << "NCCL not compiled in";
  if (GpuCount() == 0) GTEST_SKIP() << "no GPU";
  auto ids = NcclCommunicator::NewUniqueIds();
  ASSERT_TRUE(ids.ok()) << ids.status();
  const std::string self = "/proc/self/exe";
  std::vector<std::string> env_common = {
      "HICACHE_NCCL_FORWARD_ID=" +
          absl::Base64Escape(absl::string_view(
              reinterpret_cast<const char*>(ids->forward.data()), 128)),
      "HICACHE_NCCL_BACKWARD_ID=" +
          absl::Base64Escape(absl::string_view(
              reinterpret_cast<const char*>(ids->backward.data()), 128)),
      "NCCL_SOCKET_IFNAME=lo"};
  std::vector<testing::Subprocess> peers;
  char exe[4096] = {0};
  ASSERT_GT(readlink(self.c_str(), exe, sizeof(exe) - 1), 0);
  for (int side : {0, 1}) {
    std::vector<std::string> env = env_common;
    env.push_back(absl::StrCat("HICACHE_NCCL_PEER_SIDE=", side));
    env.push_back(absl::StrCat("NCCL_HOSTID=hicache-nccl-test-", side));
    auto peer = testing::Subprocess::Start(
        {exe, "--gtest_filter=NcclPeer.Run"}, env);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peers.push_back(*std::move(peer));
  }
  for (int side : {0, 1}) {
    absl::StatusOr<int> rc = peers[side].Wait(absl::Seconds(120));
    ASSERT_TRUE(rc.ok()) << "side " << side << ": " << rc.status();
    EXPECT_EQ(*rc, 0) << "side " << side << "\n"
                      << peers[side].Stdout() << peers[side].Stderr();
    std::printf("side %d:\n%s", side, peers[side].Stdout().c_str());
  }
}

}  // namespace
}  // namespace hicache
