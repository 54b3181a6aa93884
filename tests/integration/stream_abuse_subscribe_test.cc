// A worker's Subscribe stream abused against a real hicached process
// (stream_abuse_support.h): cancelled, or its process killed, while events
// flow, or left unread until its backlog overflows. The daemon unsubscribes
// it, frees its stream slot (probed with --max_streams_per_session: Stats
// and ListSessions count no streams) and keeps serving the other workers;
// a Subscribe without a worker session is refused and holds no slot.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/support/channel_arguments.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/integration/stream_abuse_support.h"
#include "tests/testing/subprocess.h"

namespace hicache::stream_abuse_testing {
namespace {

using ::testing::HasSubstr;
using testing::Subprocess;

// The helper process of KilledSubscriberProcessFreesItsSlot (this binary,
// re-run with this test filter) reads its socket and session from these.
const char kHelperSocketEnv[] = "HICACHE_STREAM_ABUSE_SOCKET";
const char kHelperSessionEnv[] = "HICACHE_STREAM_ABUSE_SESSION";

// --- Worker Subscribe streams that go away ---------------------------------

TEST_F(StreamAbuseTest, CancelledSubscribeUnsubscribesAndFreesItsSlot) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  // Worker 1 listens throughout.
  auto steady = Subscription::Open(stub_.get(), w1, /*background=*/true);
  ASSERT_TRUE(steady.ok()) << steady.status();
  const std::vector<int64_t> pages = Allocate(scheduler, 16);
  ASSERT_EQ(pages.size(), 16u);
  BackupStream stream(stub_.get(), scheduler);
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread churn([&] {
    while (!stop.load()) {
      Churn(stream, pages);
      if (::testing::Test::HasFatalFailure()) return;
      rounds.fetch_add(1);
    }
  });
  struct Joiner {  // Also when an assertion below returns early.
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Joiner() {
      stop = true;
      if (thread.joinable()) thread.join();
    }
  } joiner{stop, churn};
  // Worker 0 subscribes and cancels, more times than it has stream slots,
  // each time in the middle of a flow of events.
  for (int i = 0; i < 3 * kMaxStreams; ++i) {
    auto sub = Subscription::OpenWhenFree(stub_.get(), w0, false);
    ASSERT_TRUE(sub.ok()) << "subscription " << i << ": " << sub.status();
    v1::WorkerEvent event;
    for (int n = 0; n < 5; ++n) {
      ASSERT_TRUE((*sub)->Read(&event)) << "subscription " << i;
      EXPECT_EQ(event.rank(), 0u);
    }
    (*sub)->Cancel();
    const grpc::Status status = (*sub)->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
        << status.error_message();
  }
  // The daemon kept serving the other worker while worker 0 came and went.
  const int64_t heard = (*steady)->count();
  EXPECT_GT(heard, 0);
  EXPECT_TRUE((*steady)->WaitCount(heard + 10))
      << "worker 1 stopped hearing events";
  stop = true;
  churn.join();
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_GT(rounds.load(), 0);
  EXPECT_FALSE((*steady)->ended());
  // No slot of worker 0 leaked, and nothing else either.
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
  EXPECT_TRUE(stream.Close().ok());
  EXPECT_TRUE(stream.Errors().empty());
  const v1::CacheStats stats = Stats();
  EXPECT_EQ(stats.sessions(), 3);
  EXPECT_EQ(ListedSessions(), 3);
  EXPECT_EQ(stats.session_locks(), 0);
  EXPECT_EQ(stats.pending_backups(), 0);
  EXPECT_EQ(stats.session_pages(), 16);  // The churn's own pages.
}

// The helper process of the next test: subscribes, says so on stdout, then
// never reads again until it is killed. Skipped unless run by that test.
TEST(StreamAbuseHelper, DISABLED_SubscribeThenHang) {
  const char* socket = getenv(kHelperSocketEnv);
  const char* session = getenv(kHelperSessionEnv);
  if (socket == nullptr || session == nullptr) GTEST_SKIP();
  auto stub = v1::HiCache::NewStub(OwnChannel(socket));
  auto sub = Subscription::Open(stub.get(), session, /*background=*/false);
  if (!sub.ok()) {
    std::printf("failed: %s\n", sub.status().ToString().c_str());
    std::fflush(stdout);
    _exit(1);
  }
  std::printf("live\n");
  std::fflush(stdout);
  absl::SleepFor(absl::Seconds(120));
  _exit(0);
}

TEST_F(StreamAbuseTest, KilledSubscriberProcessFreesItsSlot) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  auto steady = Subscription::Open(stub_.get(), w1, /*background=*/true);
  ASSERT_TRUE(steady.ok()) << steady.status();
  // Worker 0's subscription lives in another process (this binary), which
  // then stops reading and is killed: its connection drops, nobody cancels.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  absl::StatusOr<Subprocess> child = Subprocess::Start({
      "/usr/bin/env",
      "-u",
      "TEST_PREMATURE_EXIT_FILE",
      "-u",
      "XML_OUTPUT_FILE",
      absl::StrCat(kHelperSocketEnv, "=", socket_),
      absl::StrCat(kHelperSessionEnv, "=", w0),
      self,
      "--gtest_filter=StreamAbuseHelper.DISABLED_SubscribeThenHang",
      "--gtest_also_run_disabled_tests",
  });
  ASSERT_TRUE(child.ok()) << child.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (child->Stdout().find("live") == std::string::npos &&
         child->Running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_THAT(child->Stdout(), HasSubstr("live")) << child->Stderr();
  // Events flow to both workers, then the first one dies.
  const std::vector<int64_t> pages = Allocate(scheduler, 16);
  BackupStream stream(stub_.get(), scheduler);
  ASSERT_NO_FATAL_FAILURE(Churn(stream, pages));
  ASSERT_TRUE(child->Signal(SIGKILL).ok());
  ASSERT_TRUE(child->Wait(absl::Seconds(10)).ok());
  ASSERT_NO_FATAL_FAILURE(Churn(stream, pages));
  // Worker 1 heard every event of both rounds: 2 x 16 x (2 steps + end).
  EXPECT_TRUE((*steady)->WaitCount(2 * 16 * (kSteps + 1)))
      << (*steady)->count();
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
  EXPECT_TRUE(stream.Close().ok());
  EXPECT_EQ(Stats().sessions(), 3);
  EXPECT_EQ(ListedSessions(), 3);
}

TEST_F(StreamAbuseTest, SubscriberThatStopsReadingIsCutOffAlone) {
  // A small backlog: a stream whose client stops reading is cut off once
  // 256 events wait for it.
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--max_stream_backlog=256"}));
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  const std::string w1 = Open(v1::ROLE_WORKER, 1);
  auto steady = Subscription::Open(stub_.get(), w1, /*background=*/true);
  ASSERT_TRUE(steady.ok()) << steady.status();
  // Worker 0 reads `subscribed`, then nothing: on a connection of its own
  // with a small flow-control window, so the daemon's writes block soon.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  auto stuck_stub = v1::HiCache::NewStub(OwnChannel(socket_, args));
  auto stuck = Subscription::Open(stuck_stub.get(), w0, /*background=*/false);
  ASSERT_TRUE(stuck.ok()) << stuck.status();
  ASSERT_EQ(kMaxStreams, 2);
  auto second = Subscription::Open(stub_.get(), w0, /*background=*/true);
  ASSERT_TRUE(second.ok()) << second.status();  // Worker 0's other slot.
  // Worker 0 now holds both of its slots: once the stuck stream is cut
  // off, one is free again.
  const std::vector<int64_t> pages = Allocate(scheduler, 32);
  BackupStream stream(stub_.get(), scheduler);
  bool cut = false;
  int rounds = 0;
  for (; rounds < 200 && !cut; ++rounds) {
    ASSERT_NO_FATAL_FAILURE(Churn(stream, pages));
    auto probe = Subscription::Open(stub_.get(), w0, /*background=*/true);
    cut = probe.ok();
  }
  ASSERT_TRUE(cut) << "a worker stream nobody read was never cut off after "
                   << rounds << " rounds of " << 32 * (kSteps + 1) << " events";
  // The stuck stream ends (its buffered events, then the daemon's cancel)
  // without the client cancelling anything.
  const grpc::Status status = (*stuck)->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED)
      << status.error_message();
  // The readers that kept up were never cut off and heard everything.
  const int64_t expected = rounds * 32 * (kSteps + 1);
  EXPECT_TRUE((*steady)->WaitCount(expected)) << (*steady)->count();
  EXPECT_TRUE((*second)->WaitCount(expected)) << (*second)->count();
  EXPECT_FALSE((*steady)->ended());
  EXPECT_FALSE((*second)->ended());
  EXPECT_TRUE(stream.Close().ok());
  EXPECT_TRUE(stream.Errors().empty());
}

TEST_F(StreamAbuseTest, SubscribeNeedsAWorkerSession) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string scheduler = Open(v1::ROLE_SCHEDULER);
  auto refused = Subscription::Open(stub_.get(), scheduler, false);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("worker session"));
  auto unknown = Subscription::Open(stub_.get(), "s1-nosuchsession", false);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  // Refusals hold no stream slot.
  const std::string w0 = Open(v1::ROLE_WORKER, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectEveryStreamSlotFree(w0));
}

}  // namespace
}  // namespace hicache::stream_abuse_testing
