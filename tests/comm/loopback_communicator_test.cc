#include "daemon/comm/loopback_communicator.h"

#include <atomic>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/comm/link_probe.h"

namespace hicache::comm {
namespace {

using testing::LinkProbe;
using testing::NumberedFrame;

TEST(LoopbackCommunicatorTest, PeersNameEachOther) {
  auto [a, b] = LoopbackCommunicator::CreatePair("leader", "follower 1");
  EXPECT_EQ(a->peer(), "follower 1");
  EXPECT_EQ(b->peer(), "leader");
}

TEST(LoopbackCommunicatorTest, DeliversInOrderBothWaysConcurrently) {
  LinkProbe pa, pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(pa.StartOn(*a).ok());
  ASSERT_TRUE(pb.StartOn(*b).ok());
  constexpr int kFrames = 5000;
  auto send_all = [](Communicator& link, const std::string& prefix) {
    for (int i = 0; i < kFrames; ++i) {
      ASSERT_TRUE(link.Send(NumberedFrame(prefix, i, i % 7)).ok());
    }
  };
  std::thread ta(send_all, std::ref(*a), "a");
  std::thread tb(send_all, std::ref(*b), "b");
  ta.join();
  tb.join();
  ASSERT_TRUE(pa.WaitFrames(kFrames));
  ASSERT_TRUE(pb.WaitFrames(kFrames));
  const auto got_a = pa.frames();
  const auto got_b = pb.frames();
  ASSERT_EQ(got_a.size(), kFrames);
  ASSERT_EQ(got_b.size(), kFrames);
  for (int i = 0; i < kFrames; ++i) {
    ASSERT_EQ(got_a[i], NumberedFrame("b", i, i % 7));
    ASSERT_EQ(got_b[i], NumberedFrame("a", i, i % 7));
  }
  // Callbacks ran on the communicator's own threads.
  EXPECT_NE(pa.callback_thread(), std::this_thread::get_id());
  EXPECT_NE(pa.callback_thread(), pb.callback_thread());
  EXPECT_TRUE(pa.violations().empty());
  EXPECT_TRUE(pb.violations().empty());
}

TEST(LoopbackCommunicatorTest, FramesSentBeforeStartAreQueued) {
  LinkProbe pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(a->Send("one").ok());
  ASSERT_TRUE(a->Send("").ok());  // An empty frame is a frame.
  ASSERT_TRUE(a->Send("three").ok());
  EXPECT_EQ(b->pending(), 3u);
  ASSERT_TRUE(pb.StartOn(*b).ok());
  ASSERT_TRUE(pb.WaitFrames(3));
  EXPECT_EQ(pb.frames(), (std::vector<std::string>{"one", "", "three"}));
}

TEST(LoopbackCommunicatorTest, LargestFrameAcceptedOversizeRefused) {
  LinkProbe pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(pb.StartOn(*b).ok());
  EXPECT_EQ(a->Send(std::string(kMaxFrameBytes + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a->Send(std::string(kMaxFrameBytes, 'y')).ok());
  ASSERT_TRUE(a->Send("after").ok());
  ASSERT_TRUE(pb.WaitFrames(2));
  const auto got = pb.frames();
  ASSERT_EQ(got.size(), 2u);  // The refused frame was not queued.
  EXPECT_EQ(got[0].size(), kMaxFrameBytes);
  EXPECT_EQ(got[1], "after");
  // The refusal did not fail the link.
  EXPECT_EQ(pb.failures(), 0);
}

TEST(LoopbackCommunicatorTest, StartTwiceIsRefused) {
  LinkProbe p1, p2;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(p1.StartOn(*a).ok());
  EXPECT_EQ(p2.StartOn(*a).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LoopbackCommunicatorTest, AbortFailsBothEndsOnce) {
  LinkProbe pa, pb;
  auto [a, b] = LoopbackCommunicator::CreatePair("a", "b");
  ASSERT_TRUE(pa.StartOn(*a).ok());
  ASSERT_TRUE(pb.StartOn(*b).ok());
  ASSERT_TRUE(a->Send("before").ok());
  a->Abort(absl::AbortedError("leaving"));
  a->Abort(absl::InternalError("again"));  // Idempotent.
  const auto ca = pa.WaitFailure();
  ASSERT_TRUE(ca.has_value());
  EXPECT_EQ(ca->code(), absl::StatusCode::kAborted);
  // The survivor sees what a closed connection looks like, after the frame
  // that had already reached it.
  const auto cb = pb.WaitFailure();
  ASSERT_TRUE(cb.has_value());
  EXPECT_EQ(cb->code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(cb->message().find("peer a"), std::string::npos) << *cb;
  EXPECT_EQ(pb.frames(), (std::vector<std::string>{"before"}));
  const absl::Status sa = a->Send("x");
  EXPECT_EQ(sa.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(sa.message().find("leaving"), std::string::npos) << sa;
  EXPECT_EQ(b->Send("x").code(), absl::StatusCode::kFailedPrecondition);
  // Start after the failure is refused without calling on_failure.
  LinkProbe late;
  EXPECT_EQ(late.StartOn(*a).code(), absl::StatusCode::kFailedPrecondition);
  a.reset();
  b.reset();
  EXPECT_EQ(pa.failures(), 1);
  EXPECT_EQ(pb.failures(), 1);
  EXPECT_EQ(late.failures(), 0);
  EXPECT_TRUE(pa.violations().empty());
  EXPECT_TRUE(pb.violations().empty());
}

TEST(LoopbackCommunicatorTest, DestroyingAnEndIsAPeerClose) {
  LinkProbe pa, pb;
  auto [a, b] = LoopbackCommunicator::CreatePair("a", "b");
  ASSERT_TRUE(pa.StartOn(*a).ok());
  ASSERT_TRUE(pb.StartOn(*b).ok());
  a.reset();
  const auto ca = pa.WaitFailure(std::chrono::milliseconds(0));
  ASSERT_TRUE(ca.has_value());  // The destructor joined after on_failure.
  EXPECT_EQ(ca->code(), absl::StatusCode::kCancelled);
  const auto cb = pb.WaitFailure();
  ASSERT_TRUE(cb.has_value());
  EXPECT_EQ(cb->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(b->Send("x").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(LoopbackCommunicatorTest, DestroyBeforeStartCallsNothing) {
  LinkProbe pb;
  {
    auto [a, b] = LoopbackCommunicator::CreatePair();
    ASSERT_TRUE(a->Send("lost").ok());
    a.reset();
    // b was never started: it cannot start on a failed link.
    EXPECT_EQ(pb.StartOn(*b).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(pb.failures(), 0);
  EXPECT_EQ(pb.frame_count(), 0u);
}

TEST(LoopbackCommunicatorTest, BreakDropsUndeliveredFramesOnBothEnds) {
  LinkProbe pa, pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(a->Send("never").ok());  // b not started: stays queued.
  a->Break(absl::UnavailableError("cable cut"));
  ASSERT_TRUE(pa.StartOn(*a).code() == absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(pb.StartOn(*b).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(b->pending(), 0u);
  const absl::Status s = b->Send("x");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cable cut"), std::string::npos) << s;
}

TEST(LoopbackCommunicatorTest, BreakAfterStartReportsTheCauseOnBothEnds) {
  LinkProbe pa, pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(pa.StartOn(*a).ok());
  ASSERT_TRUE(pb.StartOn(*b).ok());
  b->Break(absl::DeadlineExceededError("no heartbeat"));
  for (LinkProbe* p : {&pa, &pb}) {
    const auto c = p->WaitFailure();
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(c->code(), absl::StatusCode::kDeadlineExceeded);
  }
  b->Break(absl::InternalError("second"));  // No second report.
  a.reset();
  b.reset();
  EXPECT_EQ(pa.failures(), 1);
  EXPECT_EQ(pb.failures(), 1);
}

TEST(LoopbackCommunicatorTest, HookErrorDropsTheFrameAndBreaksTheLink) {
  // Everything the callbacks use outlives the communicators.
  std::atomic<int> seen{0};
  LinkProbe pa, pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  b->SetDeliveryHook([&](absl::string_view frame) {
    ++seen;
    if (frame == "poison") return absl::DataLossError("injected");
    return absl::OkStatus();
  });
  ASSERT_TRUE(pa.StartOn(*a).ok());
  ASSERT_TRUE(pb.StartOn(*b).ok());
  ASSERT_TRUE(a->Send("ok").ok());
  ASSERT_TRUE(a->Send("poison").ok());
  const auto cb = pb.WaitFailure();
  ASSERT_TRUE(cb.has_value());
  EXPECT_EQ(cb->code(), absl::StatusCode::kDataLoss);
  const auto ca = pa.WaitFailure();
  ASSERT_TRUE(ca.has_value());
  EXPECT_EQ(ca->code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(pb.frames(), (std::vector<std::string>{"ok"}));
  EXPECT_EQ(seen.load(), 2);
}

TEST(LoopbackCommunicatorTest, BlockingHookDelaysAndAbortStillFailsOnce) {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> first{true};
  LinkProbe pb;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  b->SetDeliveryHook([&](absl::string_view) {
    if (first.exchange(false)) {
      entered.set_value();
      released.wait();
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(pb.StartOn(*b).ok());
  ASSERT_TRUE(a->Send("held").ok());
  ASSERT_TRUE(a->Send("queued").ok());
  entered.get_future().wait();
  EXPECT_EQ(pb.frame_count(), 0u);  // Delayed by the hook.
  // Abort returns without waiting for the delivery thread or calling back.
  b->Abort(absl::CancelledError("stop"));
  EXPECT_EQ(pb.failures(), 0);
  release.set_value();
  const auto cb = pb.WaitFailure();
  ASSERT_TRUE(cb.has_value());
  EXPECT_EQ(cb->code(), absl::StatusCode::kCancelled);
  // The frame held across the abort is not delivered after it.
  EXPECT_EQ(pb.frame_count(), 0u);
}

TEST(LoopbackCommunicatorTest, ThrowingReceiverFailsTheLinkInsteadOfEscaping) {
  std::promise<absl::Status> failed;
  auto [a, b] = LoopbackCommunicator::CreatePair();
  ASSERT_TRUE(b->Start([](absl::string_view) { throw std::runtime_error("x"); },
                       [&](const absl::Status& s) { failed.set_value(s); })
                  .ok());
  ASSERT_TRUE(a->Send("boom").ok());
  EXPECT_EQ(failed.get_future().get().code(), absl::StatusCode::kInternal);
}

TEST(LoopbackCommunicatorTest, AbortFromInsideTheReceiver) {
  std::promise<absl::Status> failed;
  std::promise<absl::Status> send_in_failure;
  std::atomic<int> delivered{0};
  auto [a, b] = LoopbackCommunicator::CreatePair();
  LoopbackCommunicator* end = b.get();
  ASSERT_TRUE(end->Start(
                     [&](absl::string_view frame) {
                       ++delivered;
                       if (frame == "bad") {
                         end->Abort(absl::DataLossError("bad frame"));
                       }
                     },
                     [&](const absl::Status& cause) {
                       send_in_failure.set_value(end->Send("late"));
                       failed.set_value(cause);
                     })
                  .ok());
  ASSERT_TRUE(a->Send("good").ok());
  ASSERT_TRUE(a->Send("bad").ok());
  for (int i = 0; i < 100; ++i) (void)a->Send("after");
  EXPECT_EQ(failed.get_future().get().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(send_in_failure.get_future().get().code(),
            absl::StatusCode::kFailedPrecondition);
  b.reset();
  EXPECT_EQ(delivered.load(), 2);
}

// Abort, Break, Send and destruction racing from several threads: each end
// reports exactly once, never delivers after that, and never calls back from
// the racing threads.
TEST(LoopbackCommunicatorTest, FailureIsReportedExactlyOnceUnderRaces) {
  for (int round = 0; round < 200; ++round) {
    LinkProbe pa, pb;
    auto ends = LoopbackCommunicator::CreatePair();
    auto& a = ends.first;  // Not a structured binding: lambdas capture it.
    auto& b = ends.second;
    ASSERT_TRUE(pa.StartOn(*a).ok());
    ASSERT_TRUE(pb.StartOn(*b).ok());
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    std::vector<std::thread> threads;
    threads.emplace_back([&, start] {
      start.wait();
      for (int i = 0; i < 50; ++i) (void)a->Send(NumberedFrame("a", i));
    });
    threads.emplace_back([&, start] {
      start.wait();
      for (int i = 0; i < 50; ++i) (void)b->Send(NumberedFrame("b", i));
    });
    threads.emplace_back([&, start] {
      start.wait();
      a->Abort(absl::AbortedError("a"));
    });
    threads.emplace_back([&, start] {
      start.wait();
      b->Break(absl::UnavailableError("b"));
    });
    threads.emplace_back([&, start] {
      start.wait();
      b->Abort(absl::CancelledError("c"));
    });
    go.set_value();
    for (auto& t : threads) t.join();
    if (round % 2 == 0) {
      a.reset();
      b.reset();
    } else {
      b.reset();
      a.reset();
    }
    ASSERT_EQ(pa.failures(), 1) << "round " << round;
    ASSERT_EQ(pb.failures(), 1) << "round " << round;
    ASSERT_TRUE(pa.violations().empty()) << pa.violations()[0];
    ASSERT_TRUE(pb.violations().empty()) << pb.violations()[0];
    // Frames that did arrive came in order.
    const auto got = pb.frames();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], NumberedFrame("a", static_cast<int>(i)));
    }
  }
}

}  // namespace
}  // namespace hicache::comm
