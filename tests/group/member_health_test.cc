#include "daemon/group/member_health.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "daemon/comm/loopback_communicator.h"
#include "daemon/core/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/group/group_wire.h"
#include "daemon/group/wire_link.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

constexpr absl::Duration kInterval = absl::Milliseconds(100);
constexpr absl::Duration kTimeout = absl::Seconds(1);

// What a MemberHealth did: the heartbeats it sent and its deaths.
class Recorder {
 public:
  MemberHealth::SendFn Send() {
    return [this](const FrameBody& body) {
      MutexLock lock(&mu_);
      if (!send_result_.ok()) return absl::Status(send_result_.code(),
                                                  send_result_.message());
      sent_.push_back(body);
      return absl::OkStatus();
    };
  }
  MemberHealth::DeadFn Dead() {
    return [this](const absl::Status& reason) {
      MutexLock lock(&mu_);
      deaths_.push_back(absl::Status(reason.code(), reason.message()));
    };
  }
  void FailSends(absl::Status s) {
    MutexLock lock(&mu_);
    send_result_ = std::move(s);
  }
  std::vector<FrameBody> sent() {
    MutexLock lock(&mu_);
    return sent_;
  }
  std::vector<absl::Status> deaths() {
    MutexLock lock(&mu_);
    return deaths_;
  }

 private:
  Mutex mu_;
  absl::Status send_result_ ABSL_GUARDED_BY(mu_);
  std::vector<FrameBody> sent_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> deaths_ ABSL_GUARDED_BY(mu_);
};

MemberHealthOptions ManualOptions(FakeClock* clock) {
  return MemberHealthOptions{.peer = "follower 1 at 10.0.0.2:7070",
                             .member_index = 1,
                             .interval = kInterval,
                             .timeout = kTimeout,
                             .clock = clock,
                             .manual = true};
}

std::unique_ptr<MemberHealth> MakeManual(FakeClock* clock, Recorder* r) {
  absl::StatusOr<std::unique_ptr<MemberHealth>> h =
      MemberHealth::Create(ManualOptions(clock), r->Send(), r->Dead());
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

TEST(MemberHealth, CreateRefusesBadOptions) {
  FakeClock clock;
  Recorder r;
  auto create = [&](absl::Duration interval, absl::Duration timeout) {
    MemberHealthOptions o = ManualOptions(&clock);
    o.interval = interval;
    o.timeout = timeout;
    return MemberHealth::Create(o, r.Send(), r.Dead()).status();
  };
  EXPECT_EQ(create(absl::ZeroDuration(), kTimeout).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(-kInterval, kTimeout).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(kInterval, kInterval).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(kInterval, absl::InfiniteDuration()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(create(absl::InfiniteDuration(), absl::InfiniteDuration()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(create(kInterval, kTimeout).ok());
  EXPECT_EQ(
      MemberHealth::Create(ManualOptions(&clock), nullptr, r.Dead()).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MemberHealth::Create(ManualOptions(&clock), r.Send(), nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(MemberHealth, NothingHappensBeforeStart) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  h->Heard(FrameKind::kHeartbeat);
  clock.Advance(10 * kTimeout);
  EXPECT_EQ(h->Tick(), absl::InfiniteDuration());
  EXPECT_TRUE(r.sent().empty());
  EXPECT_TRUE(r.deaths().empty());
  EXPECT_EQ(h->snapshot().frames_heard, 0);
}

TEST(MemberHealth, SendsAHeartbeatAtOnceThenEveryInterval) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  Recorder r;
  auto h = MakeManual(&clock, &r);
  ASSERT_TRUE(h->Start().ok());
  EXPECT_EQ(h->Start().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(h->Tick(), kInterval);
  const std::vector<FrameBody> first = r.sent();
  ASSERT_EQ(first.size(), 1u);
  const auto* hb = std::get_if<Heartbeat>(&first[0]);
  ASSERT_NE(hb, nullptr);
  EXPECT_EQ(hb->member_index, 1u);
  EXPECT_EQ(hb->sender_time_ns, int64_t{1000} * 1000000000);
  // Not due yet: nothing sent, the wait is what is left.
  clock.Advance(kInterval / 4);
  EXPECT_EQ(h->Tick(), kInterval * 3 / 4);
  EXPECT_EQ(r.sent().size(), 1u);
  for (int i = 0; i < 5; ++i) {
    clock.Advance(kInterval * 3 / 4);
    h->Heard(FrameKind::kHeartbeat);
    h->Tick();
    clock.Advance(kInterval / 4);
  }
  EXPECT_EQ(r.sent().size(), 6u);
  EXPECT_EQ(h->snapshot().heartbeats_sent, 6);
  EXPECT_TRUE(r.deaths().empty());
}

TEST(MemberHealth, AnyFrameHeardKeepsThePeerAliveForever) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  ASSERT_TRUE(h->Start().ok());
  // 20 timeouts, hearing a frame just before each one expires.
  for (int i = 0; i < 20; ++i) {
    clock.Advance(kTimeout - absl::Nanoseconds(1));
    h->Heard(i % 2 == 0 ? FrameKind::kTasks : FrameKind::kHeartbeat);
    h->Tick();
  }
  EXPECT_TRUE(r.deaths().empty());
  const MemberHealthSnapshot s = h->snapshot();
  EXPECT_FALSE(s.dead);
  EXPECT_TRUE(s.heard_any);
  EXPECT_EQ(s.frames_heard, 20);
  EXPECT_EQ(s.heartbeats_received, 10);
  EXPECT_EQ(s.last_heard_age, absl::ZeroDuration());
  clock.Advance(absl::Milliseconds(250));
  EXPECT_EQ(h->snapshot().last_heard_age, absl::Milliseconds(250));
}

TEST(MemberHealth, SilenceOfTimeoutIsDeathExactlyOnce) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  ASSERT_TRUE(h->Start().ok());
  h->Tick();
  clock.Advance(absl::Milliseconds(300));
  h->Heard(FrameKind::kHeartbeat);
  // The next round is due at the next heartbeat, or the deadline if sooner.
  clock.Advance(kTimeout - absl::Nanoseconds(1));
  EXPECT_LE(h->Tick(), kInterval);
  EXPECT_TRUE(r.deaths().empty());
  EXPECT_EQ(h->Tick(), absl::Nanoseconds(1));  // Just the deadline left.
  clock.Advance(absl::Nanoseconds(1));
  const size_t sent_before = r.sent().size();
  EXPECT_EQ(h->Tick(), absl::InfiniteDuration());
  ASSERT_EQ(r.deaths().size(), 1u);
  const absl::Status reason = r.deaths()[0];
  EXPECT_EQ(reason.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(reason.message(), "10.0.0.2:7070")) << reason;
  EXPECT_TRUE(absl::StrContains(reason.message(), "nothing heard for 1s"))
      << reason;
  EXPECT_TRUE(absl::StrContains(reason.message(), "timeout 1s")) << reason;
  // Dead: no more heartbeats, no second death, frames ignored.
  for (int i = 0; i < 5; ++i) {
    clock.Advance(kTimeout);
    h->Heard(FrameKind::kHeartbeat);
    h->LinkFailed(absl::UnavailableError("late"));
    EXPECT_EQ(h->Tick(), absl::InfiniteDuration());
  }
  EXPECT_EQ(r.deaths().size(), 1u);
  EXPECT_EQ(r.sent().size(), sent_before);
  const MemberHealthSnapshot s = h->snapshot();
  EXPECT_TRUE(s.dead);
  EXPECT_EQ(s.dead_code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.dead_reason, reason.message());
  EXPECT_EQ(s.heartbeats_received, 1);
}

TEST(MemberHealth, APeerNeverHeardIsDeadOneTimeoutAfterStart) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  clock.Advance(absl::Hours(1));  // Time before Start does not count.
  ASSERT_TRUE(h->Start().ok());
  while (clock.Now() < absl::UnixEpoch() + absl::Hours(1) + kTimeout) {
    h->Tick();
    EXPECT_TRUE(r.deaths().empty());
    clock.Advance(kInterval);
  }
  h->Tick();
  ASSERT_EQ(r.deaths().size(), 1u);
  EXPECT_TRUE(absl::StrContains(r.deaths()[0].message(),
                                "nothing at all since the health check started"))
      << r.deaths()[0];
  EXPECT_FALSE(h->snapshot().heard_any);
  EXPECT_EQ(h->snapshot().heartbeats_sent, 10);
}

TEST(MemberHealth, ARefusedHeartbeatIsDeath) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  ASSERT_TRUE(h->Start().ok());
  h->Tick();
  r.FailSends(absl::FailedPreconditionError("link failed: peer closed"));
  clock.Advance(kInterval);
  h->Heard(FrameKind::kHeartbeat);
  EXPECT_EQ(h->Tick(), absl::InfiniteDuration());
  ASSERT_EQ(r.deaths().size(), 1u);
  EXPECT_EQ(r.deaths()[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(r.deaths()[0].message(),
                                "heartbeat could not be sent"));
  EXPECT_TRUE(absl::StrContains(r.deaths()[0].message(), "peer closed"));
  EXPECT_EQ(h->snapshot().heartbeats_sent, 1);
}

TEST(MemberHealth, LinkFailedIsDeathAtTheNextRoundWithTheCause) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  ASSERT_TRUE(h->Start().ok());
  h->Tick();
  h->LinkFailed(absl::DataLossError("protocol error: bad seq"));
  h->LinkFailed(absl::CancelledError("second"));
  EXPECT_EQ(h->Tick(), absl::InfiniteDuration());
  ASSERT_EQ(r.deaths().size(), 1u);
  EXPECT_EQ(r.deaths()[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(r.deaths()[0].message(), "bad seq"));
  EXPECT_FALSE(absl::StrContains(r.deaths()[0].message(), "second"));
  EXPECT_EQ(r.sent().size(), 1u);  // None sent at the round that found it.
}

TEST(MemberHealth, StopEndsItWithoutADeath) {
  FakeClock clock;
  Recorder r;
  auto h = MakeManual(&clock, &r);
  ASSERT_TRUE(h->Start().ok());
  h->Tick();
  h->LinkFailed(absl::UnavailableError("gone"));
  h->Stop();
  h->Stop();
  clock.Advance(10 * kTimeout);
  EXPECT_EQ(h->Tick(), absl::InfiniteDuration());
  EXPECT_TRUE(r.deaths().empty());
  EXPECT_EQ(r.sent().size(), 1u);
  EXPECT_TRUE(h->snapshot().stopped);
  EXPECT_FALSE(h->snapshot().dead);
  EXPECT_EQ(h->Start().code(), absl::StatusCode::kFailedPrecondition);
}

// With its own thread and the real clock.

MemberHealthOptions ThreadOptions(absl::Duration interval,
                                  absl::Duration timeout) {
  return MemberHealthOptions{.peer = "peer under test",
                             .interval = interval,
                             .timeout = timeout};
}

// Generous: a loaded 2-core CI machine under a sanitizer.
constexpr auto kSlack = std::chrono::seconds(20);

TEST(MemberHealthThread, HeartbeatsFlowThenSilenceIsDeathWithinTheBound) {
  std::promise<void> ten_sent;
  std::atomic<int> sent{0};
  std::promise<absl::Status> died;
  std::atomic<int> deaths{0};
  const absl::Duration interval = absl::Milliseconds(10);
  const absl::Duration timeout = absl::Milliseconds(300);
  auto h = MemberHealth::Create(
      ThreadOptions(interval, timeout),
      [&](const FrameBody& body) {
        const Heartbeat* hb = std::get_if<Heartbeat>(&body);
        EXPECT_NE(hb, nullptr);
        if (hb != nullptr) {
          // Stamped with the wall clock (silence is measured on a
          // monotonic one).
          EXPECT_LT(absl::AbsDuration(absl::FromUnixNanos(hb->sender_time_ns) -
                                      absl::Now()),
                    absl::Hours(1));
        }
        if (sent.fetch_add(1) + 1 == 10) ten_sent.set_value();
        return absl::OkStatus();
      },
      [&](const absl::Status& reason) {
        if (deaths.fetch_add(1) == 0) {
          died.set_value(absl::Status(reason.code(), reason.message()));
        }
      });
  ASSERT_TRUE(h.ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*h)->Start().ok());
  ASSERT_EQ(ten_sent.get_future().wait_for(kSlack), std::future_status::ready);
  std::future<absl::Status> dead = died.get_future();
  ASSERT_EQ(dead.wait_for(kSlack), std::future_status::ready);
  const absl::Duration took = absl::Now() - start;
  EXPECT_LE(took, timeout + interval + absl::FromChrono(kSlack));
  const absl::Status reason = dead.get();
  EXPECT_TRUE(absl::StrContains(reason.message(), "peer under test"));
  EXPECT_TRUE(absl::StrContains(reason.message(), "nothing heard"));
  (*h)->Stop();
  EXPECT_EQ(deaths.load(), 1);
  const int after = sent.load();
  EXPECT_EQ((*h)->snapshot().heartbeats_sent, after);
  EXPECT_TRUE((*h)->snapshot().dead);
}

TEST(MemberHealthThread, LinkFailedWakesTheThreadAtOnce) {
  std::promise<absl::Status> died;
  // An interval and timeout far beyond the test: only the wake-up can end it.
  auto h = MemberHealth::Create(
      ThreadOptions(absl::Hours(1), absl::Hours(2)),
      [](const FrameBody&) { return absl::OkStatus(); },
      [&](const absl::Status& reason) {
        died.set_value(absl::Status(reason.code(), reason.message()));
      });
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE((*h)->Start().ok());
  (*h)->LinkFailed(absl::UnavailableError("peer reset the connection"));
  std::future<absl::Status> dead = died.get_future();
  ASSERT_EQ(dead.wait_for(kSlack), std::future_status::ready);
  EXPECT_TRUE(absl::StrContains(dead.get().message(), "reset the connection"));
}

TEST(MemberHealthThread, StopFromInsideOnDeadAndFromOutside) {
  std::promise<void> died;
  std::unique_ptr<MemberHealth> health;
  auto h = MemberHealth::Create(
      ThreadOptions(absl::Hours(1), absl::Hours(2)),
      [](const FrameBody&) { return absl::OkStatus(); },
      [&](const absl::Status&) {
        health->Stop();  // Must not wait for itself.
        EXPECT_TRUE(health->snapshot().stopped);
        died.set_value();
      });
  ASSERT_TRUE(h.ok());
  health = std::move(*h);
  ASSERT_TRUE(health->Start().ok());
  health->LinkFailed(absl::UnavailableError("x"));
  ASSERT_EQ(died.get_future().wait_for(kSlack), std::future_status::ready);
  health->Stop();
  health.reset();  // Joins the thread left by the inner Stop.

  // Stopped while waiting: ends at once, no death.
  std::atomic<int> deaths{0};
  auto quiet = MemberHealth::Create(
      ThreadOptions(absl::Hours(1), absl::Hours(2)),
      [](const FrameBody&) { return absl::OkStatus(); },
      [&](const absl::Status&) { deaths.fetch_add(1); });
  ASSERT_TRUE(quiet.ok());
  ASSERT_TRUE((*quiet)->Start().ok());
  (*quiet)->Stop();
  (*quiet)->LinkFailed(absl::UnavailableError("after stop"));
  quiet->reset();
  EXPECT_EQ(deaths.load(), 0);
}

TEST(MemberHealthThread, RacingHeardLinkFailedAndStopDeclareAtMostOnce) {
  // Many rounds of frames heard from several threads while the link fails
  // and the owner stops, all at once: at most one death, none after Stop
  // returned, heartbeats counted consistently.
  for (int round = 0; round < 40; ++round) {
    std::atomic<int> deaths{0};
    std::atomic<bool> stop_returned{false};
    std::atomic<int> deaths_after_stop{0};
    auto h = MemberHealth::Create(
        ThreadOptions(absl::Microseconds(200), absl::Milliseconds(2)),
        [](const FrameBody&) { return absl::OkStatus(); },
        [&](const absl::Status&) {
          deaths.fetch_add(1);
          if (stop_returned.load()) deaths_after_stop.fetch_add(1);
        });
    ASSERT_TRUE(h.ok());
    MemberHealth* health = h->get();
    ASSERT_TRUE(health->Start().ok());
    std::promise<void> go;
    std::shared_future<void> start = go.get_future().share();
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        start.wait();
        for (int i = 0; i < 200; ++i) {
          health->Heard(t == 0 ? FrameKind::kHeartbeat : FrameKind::kStepDones);
          if (i % 50 == 0) (void)health->snapshot();
        }
      });
    }
    threads.emplace_back([&] {
      start.wait();
      health->LinkFailed(absl::UnavailableError("racing failure"));
    });
    threads.emplace_back([&] {
      start.wait();
      health->Stop();
      stop_returned.store(true);
    });
    go.set_value();
    for (std::thread& t : threads) t.join();
    h->reset();  // Joins the health thread: any late callback is seen.
    EXPECT_LE(deaths.load(), 1) << "round " << round;
    EXPECT_EQ(deaths_after_stop.load(), 0) << "round " << round;
  }
}

// End to end: two WireLinks over a loopback pair, each end with its own
// MemberHealth fed by its link's frames.

struct End {
  comm::LoopbackCommunicator* comm = nullptr;  // Owned by link.
  std::unique_ptr<WireLink> link;
  std::unique_ptr<MemberHealth> health;
  std::atomic<int> deaths{0};
  std::promise<absl::Status> died;
  std::chrono::steady_clock::time_point died_at;
};

class MemberHealthLinkTest : public ::testing::TestWithParam<bool> {
 protected:
  static constexpr absl::Duration kLinkInterval = absl::Milliseconds(20);
  static constexpr absl::Duration kLinkTimeout = absl::Seconds(1);

  void SetUp() override {
    auto [a, b] = comm::LoopbackCommunicator::CreatePair("leader", "follower");
    ends_[0].comm = a.get();
    ends_[1].comm = b.get();
    ends_[0].link = std::make_unique<WireLink>(std::move(a), 7);
    ends_[1].link = std::make_unique<WireLink>(std::move(b), 7);
    const bool wire_failure = GetParam();
    for (int i = 0; i < 2; ++i) {
      End* end = &ends_[i];
      auto h = MemberHealth::Create(
          MemberHealthOptions{.peer = end->link->peer(),
                              .member_index = static_cast<uint32_t>(i),
                              .interval = kLinkInterval,
                              .timeout = kLinkTimeout},
          [end](const FrameBody& body) { return end->link->Send(body); },
          [end](const absl::Status& reason) {
            if (end->deaths.fetch_add(1) == 0) {
              end->died_at = std::chrono::steady_clock::now();
              end->died.set_value(absl::Status(reason.code(), reason.message()));
            }
          });
      ASSERT_TRUE(h.ok()) << h.status();
      end->health = std::move(*h);
      ASSERT_TRUE(end->link
                      ->Start(
                          [end](Frame frame) {
                            end->health->Heard(KindOf(frame.body));
                            return absl::OkStatus();
                          },
                          [end, wire_failure](const absl::Status& cause) {
                            if (wire_failure) end->health->LinkFailed(cause);
                          })
                      .ok());
    }
    for (End& end : ends_) ASSERT_TRUE(end.health->Start().ok());
  }

  void TearDown() override {
    for (End& end : ends_) end.health->Stop();
    for (End& end : ends_) end.link.reset();
    for (End& end : ends_) end.health.reset();
  }

  // Both ends live for three timeouts: nothing declared dead.
  void ExpectLiveForThreeTimeouts() {
    std::future<absl::Status> dead0 = ends_[0].died.get_future();
    EXPECT_EQ(dead0.wait_for(absl::ToChronoNanoseconds(3 * kLinkTimeout)),
              std::future_status::timeout);
    futures_[0] = std::move(dead0);
    futures_[1] = ends_[1].died.get_future();
    for (End& end : ends_) {
      const MemberHealthSnapshot s = end.health->snapshot();
      EXPECT_FALSE(s.dead) << s.dead_reason;
      EXPECT_GT(s.heartbeats_sent, 10);
      EXPECT_GT(s.heartbeats_received, 10);
    }
  }

  // `end` is declared dead within the bound after `since`, exactly once.
  absl::Status ExpectDeadWithinBound(int i,
                                     std::chrono::steady_clock::time_point since) {
    End& end = ends_[i];
    EXPECT_EQ(futures_[i].wait_for(absl::ToChronoNanoseconds(
                  kLinkTimeout + kLinkInterval) + kSlack),
              std::future_status::ready);
    if (futures_[i].wait_for(std::chrono::seconds(0)) !=
        std::future_status::ready) {
      return absl::UnknownError("never declared dead");
    }
    const absl::Status reason = futures_[i].get();
    EXPECT_LE(end.died_at - since,
              absl::ToChronoNanoseconds(kLinkTimeout + kLinkInterval) + kSlack);
    EXPECT_EQ(reason.code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StrContains(reason.message(), end.link->peer()))
        << reason;
    return reason;
  }

  End ends_[2];
  std::future<absl::Status> futures_[2];
};

TEST_P(MemberHealthLinkTest, OneSideStopsHeartbeatingTheOtherDeclaresItDead) {
  ExpectLiveForThreeTimeouts();
  const auto stopped = std::chrono::steady_clock::now();
  ends_[1].health->Stop();  // The follower goes quiet; the link stays up.
  const absl::Status reason = ExpectDeadWithinBound(0, stopped);
  EXPECT_TRUE(absl::StrContains(reason.message(), "nothing heard for"))
      << reason;
  EXPECT_TRUE(absl::StrContains(reason.message(), "follower")) << reason;
  // Exactly once, however long we wait; the quiet side saw no death.
  EXPECT_EQ(futures_[1].wait_for(absl::ToChronoNanoseconds(2 * kLinkTimeout)),
            std::future_status::timeout);
  EXPECT_EQ(ends_[0].deaths.load(), 1);
  EXPECT_EQ(ends_[1].deaths.load(), 0);
}

TEST_P(MemberHealthLinkTest, ABrokenLinkIsDeathOnBothSidesOnce) {
  ExpectLiveForThreeTimeouts();
  const auto broken = std::chrono::steady_clock::now();
  ends_[0].comm->Break(absl::UnavailableError("cable cut"));
  for (int i = 0; i < 2; ++i) {
    const absl::Status reason = ExpectDeadWithinBound(i, broken);
    if (GetParam()) {
      // Told by the link: the cause is named.
      EXPECT_TRUE(absl::StrContains(reason.message(), "cable cut")) << reason;
    }
  }
  // Wait a timeout more: still exactly once each.
  std::promise<void> never;
  EXPECT_EQ(never.get_future().wait_for(
                absl::ToChronoNanoseconds(kLinkTimeout)),
            std::future_status::timeout);
  EXPECT_EQ(ends_[0].deaths.load(), 1);
  EXPECT_EQ(ends_[1].deaths.load(), 1);
}

INSTANTIATE_TEST_SUITE_P(LinkFailureWired, MemberHealthLinkTest,
                         ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("LinkFailedWired")
                                             : std::string("SilenceOnly");
                         });

}  // namespace
}  // namespace hicache::group
