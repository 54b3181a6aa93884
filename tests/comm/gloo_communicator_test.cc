#include "daemon/comm/gloo_communicator.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gtest/gtest.h"
#include "tests/comm/gloo_link_pair.h"
#include "tests/comm/link_probe.h"
#include "tests/testing/temp_dir.h"

namespace hicache::comm {
namespace {

using testing::GlooLinkFactory;
using testing::GlooLinkPair;
using testing::LinkProbe;
using testing::NumberedFrame;

using Clock = std::chrono::steady_clock;

// A frame whose every byte depends on its position and `seed`.
std::string Pattern(size_t bytes, int seed) {
  std::string s(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) {
    s[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 11)) & 0xff);
  }
  return s;
}

class GlooCommunicatorTest : public ::testing::Test {
 protected:
  hicache::testing::TempDir dir_;
  GlooLinkFactory factory_{dir_.path()};
};

TEST_F(GlooCommunicatorTest, RejectsBadOptions) {
  auto device = factory_.Device(0);
  ASSERT_TRUE(device.ok()) << device.status();
  GlooLinkOptions good = factory_.Options(0, "bad", absl::Seconds(1));
  good.device = *device;
  auto expect_invalid = [](GlooLinkOptions o) {
    EXPECT_EQ(GlooCommunicator::Connect(std::move(o)).status().code(),
              absl::StatusCode::kInvalidArgument);
  };
  GlooLinkOptions o = good;
  o.store = nullptr;
  expect_invalid(o);
  o = good;
  o.device = nullptr;
  expect_invalid(o);
  o = good;
  o.rank = 2;
  expect_invalid(o);
  o = good;
  o.key_prefix.clear();
  expect_invalid(o);
  o = good;
  o.receive_timeout = absl::ZeroDuration();
  expect_invalid(o);
  o = good;
  o.connect_timeout = absl::InfiniteDuration();
  expect_invalid(o);
  EXPECT_EQ(GlooCommunicator::CreateTcpDevice("").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Gloo writes to sockets the peer may have reset (from its own event-loop
// thread too): without SIGPIPE ignored a hard close kills the process (seen
// as exit 141 under bazel test, whose runner leaves SIGPIPE at default).
TEST_F(GlooCommunicatorTest, CreatingADeviceIgnoresSigpipe) {
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ASSERT_EQ(sigaction(SIGPIPE, &dfl, nullptr), 0);
  ASSERT_TRUE(GlooCommunicator::CreateTcpDevice("127.0.0.1").ok());
  struct sigaction now = {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

TEST_F(GlooCommunicatorTest, ConnectWithoutPeerTimesOut) {
  auto device = factory_.Device(0);
  ASSERT_TRUE(device.ok()) << device.status();
  GlooLinkOptions o = factory_.Options(0, "alone", absl::Seconds(1));
  o.device = *device;
  o.connect_timeout = absl::Milliseconds(200);
  const auto start = Clock::now();
  auto link = GlooCommunicator::Connect(o);
  EXPECT_EQ(link.status().code(), absl::StatusCode::kDeadlineExceeded)
      << link.status();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

TEST_F(GlooCommunicatorTest, DeliversInOrderBothWaysConcurrently) {
  LinkProbe pl, pf;
  auto pair = factory_.Connect();
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->leader->peer(), "follower");
  ASSERT_TRUE(pl.StartOn(*pair->leader).ok());
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  constexpr int kFrames = 3000;
  // Sizes from empty to a few messages' worth, so that frames share
  // messages and straddle message boundaries.
  auto size_of = [](int i) -> size_t {
    if (i % 500 == 499) return GlooCommunicator::kMessageBytes * 2 + 17;
    return static_cast<size_t>((i * 37) % 3000);
  };
  auto send_all = [&](Communicator* link, const std::string& prefix) {
    for (int i = 0; i < kFrames; ++i) {
      ASSERT_TRUE(link->Send(NumberedFrame(prefix, i, size_of(i))).ok());
    }
  };
  std::thread tl(send_all, pair->leader.get(), "L");
  std::thread tf(send_all, pair->follower.get(), "F");
  tl.join();
  tf.join();
  ASSERT_TRUE(pl.WaitFrames(kFrames));
  ASSERT_TRUE(pf.WaitFrames(kFrames));
  const auto at_leader = pl.frames();
  const auto at_follower = pf.frames();
  ASSERT_EQ(at_leader.size(), kFrames);
  ASSERT_EQ(at_follower.size(), kFrames);
  for (int i = 0; i < kFrames; ++i) {
    ASSERT_EQ(at_leader[i], NumberedFrame("F", i, size_of(i))) << i;
    ASSERT_EQ(at_follower[i], NumberedFrame("L", i, size_of(i))) << i;
  }
  EXPECT_EQ(pl.failures(), 0);
  EXPECT_TRUE(pl.violations().empty());
  EXPECT_TRUE(pf.violations().empty());
}

TEST_F(GlooCommunicatorTest, LargeAndEmptyFramesArriveWhole) {
  LinkProbe pf;
  auto pair = factory_.Connect();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  const std::string mib = Pattern(size_t{1} << 20, 1);
  const std::string largest = Pattern(kMaxFrameBytes, 2);
  ASSERT_TRUE(pair->leader->Send(mib).ok());
  ASSERT_TRUE(pair->leader->Send("").ok());
  ASSERT_TRUE(pair->leader->Send(largest).ok());
  ASSERT_TRUE(pair->leader->Send("tail").ok());
  ASSERT_TRUE(pf.WaitFrames(4));
  const auto got = pf.frames();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0] == mib);
  EXPECT_EQ(got[1], "");
  EXPECT_EQ(got[2].size(), largest.size());
  EXPECT_TRUE(got[2] == largest);
  EXPECT_EQ(got[3], "tail");
}

TEST_F(GlooCommunicatorTest, OversizeFrameIsRefusedAndTheLinkLives) {
  LinkProbe pf;
  auto pair = factory_.Connect();
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  EXPECT_EQ(pair->leader->Send(std::string(kMaxFrameBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(pair->leader->Send("still up").ok());
  ASSERT_TRUE(pf.WaitFrames(1));
  EXPECT_EQ(pf.frames()[0], "still up");
  EXPECT_EQ(pf.failures(), 0);
}

TEST_F(GlooCommunicatorTest, FramesSentBeforeStartArrive) {
  LinkProbe pl, pf;
  auto pair = factory_.Connect();
  ASSERT_TRUE(pair.ok()) << pair.status();
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(pair->leader->Send(NumberedFrame("early", i)).ok());
  }
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  ASSERT_TRUE(pl.StartOn(*pair->leader).ok());
  ASSERT_TRUE(pf.WaitFrames(10));
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(pf.frames()[i], NumberedFrame("early", i));
  }
  EXPECT_EQ(pl.StartOn(*pair->leader).code(),
            absl::StatusCode::kFailedPrecondition);  // Twice.
}

TEST_F(GlooCommunicatorTest, DestroyedPeerFailsTheSurvivorWithUnavailable) {
  LinkProbe pl, pf;
  // A long receive timeout: the survivor must learn from the closed
  // connection, not from silence.
  auto pair = factory_.Connect(absl::Seconds(60), absl::Seconds(60));
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(pl.StartOn(*pair->leader).ok());
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  ASSERT_TRUE(pair->follower->Send("last words").ok());
  ASSERT_TRUE(pl.WaitFrames(1));
  const auto start = Clock::now();
  pair->follower.reset();
  const auto cf = pf.WaitFailure(std::chrono::milliseconds(0));
  ASSERT_TRUE(cf.has_value());  // Reported before the destructor returned.
  EXPECT_EQ(cf->code(), absl::StatusCode::kCancelled);
  const auto cl = pl.WaitFailure(std::chrono::seconds(20));
  ASSERT_TRUE(cl.has_value()) << "no failure on the survivor";
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(cl->code(), absl::StatusCode::kUnavailable) << *cl;
  EXPECT_NE(cl->message().find("follower"), std::string::npos) << *cl;
  const absl::Status s = pair->leader->Send("anyone?");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("follower"), std::string::npos) << s;
  pair->leader.reset();
  EXPECT_EQ(pl.failures(), 1);
  EXPECT_TRUE(pl.violations().empty());
}

TEST_F(GlooCommunicatorTest, SilentPeerIsDeadlineExceeded) {
  LinkProbe pl, pf;
  auto pair = factory_.Connect(absl::Milliseconds(300), absl::Seconds(60));
  ASSERT_TRUE(pair.ok()) << pair.status();
  const auto start = Clock::now();
  ASSERT_TRUE(pl.StartOn(*pair->leader).ok());
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  const auto cl = pl.WaitFailure(std::chrono::seconds(20));
  ASSERT_TRUE(cl.has_value());
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(300));
  EXPECT_EQ(cl->code(), absl::StatusCode::kDeadlineExceeded) << *cl;
  // The timed-out end closed the connection: the peer learns at once.
  const auto cf = pf.WaitFailure(std::chrono::seconds(20));
  ASSERT_TRUE(cf.has_value());
  EXPECT_EQ(cf->code(), absl::StatusCode::kUnavailable) << *cf;
  EXPECT_EQ(pair->leader->Send("x").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GlooCommunicatorTest, AbortUnblocksPromptlyAndIsIdempotent) {
  LinkProbe pl, pf;
  auto pair = factory_.Connect(absl::Seconds(60), absl::Seconds(60));
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(pl.StartOn(*pair->leader).ok());
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  // Both threads of the leader are blocked: the receiver in waitRecv, the
  // sender in its queue wait.
  const auto start = Clock::now();
  pair->leader->Abort(absl::AbortedError("operator said so"));
  pair->leader->Abort(absl::InternalError("second"));
  const auto cl = pl.WaitFailure(std::chrono::seconds(10));
  ASSERT_TRUE(cl.has_value());
  EXPECT_EQ(cl->code(), absl::StatusCode::kAborted);
  EXPECT_EQ(cl->message(), "operator said so");
  const auto cf = pf.WaitFailure(std::chrono::seconds(10));
  ASSERT_TRUE(cf.has_value());
  EXPECT_EQ(cf->code(), absl::StatusCode::kUnavailable) << *cf;
  pair->leader.reset();  // Joins at once.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(pl.failures(), 1);
  pair->follower->Abort(absl::CancelledError("late"));  // Already failed.
  pair->follower.reset();
  EXPECT_EQ(pf.failures(), 1);
  EXPECT_EQ(pf.frame_count(), 0u);
}

TEST_F(GlooCommunicatorTest, AbortBeforeStartRefusesStart) {
  LinkProbe pl;
  auto pair = factory_.Connect(absl::Seconds(60), absl::Seconds(60));
  ASSERT_TRUE(pair.ok()) << pair.status();
  ASSERT_TRUE(pair->leader->Send("queued").ok());
  pair->leader->Abort(absl::CancelledError("never mind"));
  EXPECT_EQ(pl.StartOn(*pair->leader).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pair->leader->Send("x").code(),
            absl::StatusCode::kFailedPrecondition);
  pair.value().leader.reset();
  EXPECT_EQ(pl.failures(), 0);  // on_failure of a refused Start: never.
}

// The receiver may abort its own link (a malformed frame at the group
// layer): no deadlock, on_failure once with that cause, nothing delivered
// after it, and Send from on_failure is refused.
TEST_F(GlooCommunicatorTest, AbortFromInsideTheReceiver) {
  std::promise<absl::Status> failed;
  std::atomic<int> delivered{0};
  std::promise<absl::Status> send_in_failure;
  LinkProbe pf;
  auto pair = factory_.Connect(absl::Seconds(60), absl::Seconds(60));
  ASSERT_TRUE(pair.ok()) << pair.status();
  GlooCommunicator* leader = pair->leader.get();
  ASSERT_TRUE(leader
                  ->Start(
                      [&](absl::string_view frame) {
                        ++delivered;
                        if (frame == "bad") {
                          leader->Abort(absl::DataLossError("bad frame"));
                        }
                      },
                      [&](const absl::Status& cause) {
                        send_in_failure.set_value(leader->Send("late"));
                        failed.set_value(cause);
                      })
                  .ok());
  ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
  ASSERT_TRUE(pair->follower->Send("good").ok());
  ASSERT_TRUE(pair->follower->Send("bad").ok());
  for (int i = 0; i < 100; ++i) (void)pair->follower->Send("after");
  const absl::Status cause = failed.get_future().get();
  EXPECT_EQ(cause.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(send_in_failure.get_future().get().code(),
            absl::StatusCode::kFailedPrecondition);
  pair->leader.reset();
  EXPECT_EQ(delivered.load(), 2);
  const auto cf = pf.WaitFailure(std::chrono::seconds(20));
  ASSERT_TRUE(cf.has_value());
  EXPECT_EQ(cf->code(), absl::StatusCode::kUnavailable);
}

// A raw Gloo peer sends a message whose header claims more bytes than a
// message holds: the link fails with DATA_LOSS, nothing is delivered, and
// the process survives.
TEST_F(GlooCommunicatorTest, MalformedMessageIsDataLoss) {
  LinkProbe pl;
  auto d0 = factory_.Device(0);
  auto d1 = factory_.Device(1);
  ASSERT_TRUE(d0.ok() && d1.ok());
  GlooLinkOptions o = factory_.Options(0, "raw", absl::Seconds(60));
  o.device = *d0;
  auto raw = std::async(std::launch::async, [&]() -> std::string {
    try {
      auto ctx = std::make_shared<gloo::rendezvous::Context>(1, 2);
      ctx->setTimeout(std::chrono::seconds(30));
      gloo::rendezvous::PrefixStore store("raw", factory_.store(1));
      std::shared_ptr<gloo::transport::Device> dev = *d1;
      ctx->connectFullMesh(store, dev);
      std::vector<char> mem(64, 0);
      const uint32_t lie = 0x7fffffff;
      std::memcpy(mem.data(), &lie, sizeof(lie));  // Little-endian host.
      auto buf = ctx->createUnboundBuffer(mem.data(), mem.size());
      buf->send(0, GlooCommunicator::MessageSlot(1), 0, mem.size());
      buf->waitSend(std::chrono::seconds(30));
      // Wait for the communicator to hang up.
      std::vector<char> in(GlooCommunicator::kMessageBytes);
      auto rbuf = ctx->createUnboundBuffer(in.data(), in.size());
      rbuf->recv(0, GlooCommunicator::MessageSlot(0), 0, in.size());
      rbuf->waitRecv(std::chrono::seconds(30));
      return "raw peer: the link stayed up";
    } catch (const std::exception& e) {
      return std::string("closed: ") + e.what();
    }
  });
  auto link = GlooCommunicator::Connect(o);
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE(pl.StartOn(**link).ok());
  const auto cause = pl.WaitFailure(std::chrono::seconds(20));
  ASSERT_TRUE(cause.has_value());
  EXPECT_EQ(cause->code(), absl::StatusCode::kDataLoss) << *cause;
  EXPECT_EQ(pl.frame_count(), 0u);
  const std::string raw_end = raw.get();
  EXPECT_EQ(raw_end.rfind("closed: ", 0), 0u) << raw_end;
  link->reset();
}

// Abort from both ends, sends and destruction racing: each end reports
// exactly once, never delivers after that, and no exception escapes.
TEST_F(GlooCommunicatorTest, FailureIsReportedExactlyOnceUnderRaces) {
  for (int round = 0; round < 30; ++round) {
    LinkProbe pl, pf;
    auto pair = factory_.Connect(absl::Seconds(60), absl::Seconds(60));
    ASSERT_TRUE(pair.ok()) << pair.status();
    ASSERT_TRUE(pl.StartOn(*pair->leader).ok());
    ASSERT_TRUE(pf.StartOn(*pair->follower).ok());
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    Communicator* leader = pair->leader.get();
    Communicator* follower = pair->follower.get();
    std::vector<std::thread> threads;
    threads.emplace_back([=] {
      start.wait();
      for (int i = 0; i < 200; ++i) (void)leader->Send(NumberedFrame("L", i));
    });
    threads.emplace_back([=] {
      start.wait();
      for (int i = 0; i < 200; ++i) {
        (void)follower->Send(NumberedFrame("F", i, 5000));
      }
    });
    threads.emplace_back([=] {
      start.wait();
      if (round % 3 != 0) leader->Abort(absl::AbortedError("leader"));
    });
    threads.emplace_back([=] {
      start.wait();
      follower->Abort(absl::AbortedError("follower"));
    });
    go.set_value();
    for (auto& t : threads) t.join();
    if (round % 2 == 0) {
      pair->leader.reset();
      pair->follower.reset();
    } else {
      pair->follower.reset();
      pair->leader.reset();
    }
    ASSERT_EQ(pl.failures(), 1) << "round " << round;
    ASSERT_EQ(pf.failures(), 1) << "round " << round;
    ASSERT_TRUE(pl.violations().empty()) << pl.violations()[0];
    ASSERT_TRUE(pf.violations().empty()) << pf.violations()[0];
    const auto got = pf.frames();  // What arrived came in order.
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], NumberedFrame("L", static_cast<int>(i)));
    }
  }
}

}  // namespace
}  // namespace hicache::comm
