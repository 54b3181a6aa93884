// EventForwarder: the leader's tapped worker events reach the members that
// hold their ranks (outcomes reach every member), in order, batched; a
// member whose queue passes the bound, or whose send fails, is failed once
// and loudly; Detach and Stop leave nothing running.
#include "daemon/group/event_forwarder.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace hicache::group {
namespace {

constexpr auto kWait = std::chrono::seconds(30);

// What one member's link received.
class FakeMember {
 public:
  EventForwarder::SendFn Sender() {
    return [this](const FrameBody& body) -> absl::Status {
      std::unique_lock<std::mutex> lock(mu_);
      if (!send_status_.ok()) return send_status_;
      const auto* batch = std::get_if<WorkerEventBatch>(&body);
      if (batch == nullptr) return absl::InternalError("not worker events");
      ++frames_;
      for (const WorkerEventRecord& e : batch->events) events_.push_back(e);
      cv_.notify_all();
      return absl::OkStatus();
    };
  }
  EventForwarder::FailFn OnFail() {
    return [this](const absl::Status& cause) {
      std::unique_lock<std::mutex> lock(mu_);
      failures_.push_back(
          absl::Status(cause.code(), std::string(cause.message())));
      cv_.notify_all();
    };
  }
  // Waits until `n` events arrived; returns them.
  std::vector<WorkerEventRecord> Await(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kWait, [&] { return events_.size() >= n; });
    return events_;
  }
  std::vector<absl::Status> AwaitFailure() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kWait, [&] { return !failures_.empty(); });
    return failures_;
  }
  void FailSends(absl::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    send_status_ = status;
  }
  int frames() {
    std::unique_lock<std::mutex> lock(mu_);
    return frames_;
  }
  size_t count() {
    std::unique_lock<std::mutex> lock(mu_);
    return events_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  absl::Status send_status_;
  std::vector<WorkerEventRecord> events_;
  std::vector<absl::Status> failures_;
  int frames_ = 0;
};

OpEvent Step(uint64_t op, Rank rank, uint32_t step) {
  return OpEvent{.type = OpEvent::Type::kBackupStep,
                 .op = op,
                 .rank = rank,
                 .step = step};
}

TEST(EventForwarderTest, PerRankEventsToTheirHolderOutcomesToEveryone) {
  EventForwarder forwarder;
  FakeMember a, b;
  ASSERT_TRUE(forwarder.Attach("a", {1}, a.Sender(), a.OnFail()).ok());
  ASSERT_TRUE(forwarder.Attach("b", {2, 3}, b.Sender(), b.OnFail()).ok());
  forwarder.Publish(Step(7, 1, 0), "ns");
  forwarder.Publish(OpEvent{.type = OpEvent::Type::kLoadStep,
                            .op = 8,
                            .rank = 3,
                            .step = 2,
                            .fence = std::string("\0f", 2)},
                    "ns2");
  forwarder.Publish(Step(7, 0, 0), "ns");  // The leader's own rank: nobody.
  forwarder.Publish(OpEvent{.type = OpEvent::Type::kCommitted, .op = 7}, "ns");
  forwarder.Publish(
      OpEvent{.type = OpEvent::Type::kLoadDone, .op = 8, .ok = false}, "ns2");

  std::vector<WorkerEventRecord> got_a = a.Await(3);
  ASSERT_EQ(got_a.size(), 3u);
  EXPECT_EQ(got_a[0], (WorkerEventRecord{.op = 7,
                                         .kind = WorkerEventKind::kBackupStep,
                                         .rank = 1,
                                         .ns = "ns"}));
  EXPECT_EQ(got_a[1].kind, WorkerEventKind::kCommitted);
  EXPECT_EQ(got_a[2].kind, WorkerEventKind::kLoadDone);
  EXPECT_FALSE(got_a[2].ok);
  std::vector<WorkerEventRecord> got_b = b.Await(3);
  ASSERT_EQ(got_b.size(), 3u);
  EXPECT_EQ(got_b[0], (WorkerEventRecord{.op = 8,
                                         .kind = WorkerEventKind::kLoadStep,
                                         .rank = 3,
                                         .step = 2,
                                         .fence = std::string("\0f", 2),
                                         .ns = "ns2"}));
  EXPECT_EQ(got_b[1].kind, WorkerEventKind::kCommitted);
  EXPECT_EQ(got_b[2].ns, "ns2");
  forwarder.Stop();
  EXPECT_EQ(a.count(), 3u);
  EXPECT_EQ(b.count(), 3u);
  EXPECT_EQ(forwarder.stats().events_published, 5);
  EXPECT_EQ(forwarder.stats().events_sent, 6);
}

TEST(EventForwarderTest, OrderKeptAcrossBatches) {
  // Tiny batches: many frames, every event once, in order.
  EventForwarder forwarder({.max_queued_events = 100000, .max_batch_bytes = 100});
  FakeMember a;
  ASSERT_TRUE(forwarder.Attach("a", {0}, a.Sender(), a.OnFail()).ok());
  constexpr int kN = 2000;
  for (int i = 0; i < kN; ++i) forwarder.Publish(Step(i, 0, i % 7), "ns");
  std::vector<WorkerEventRecord> got = a.Await(kN);
  ASSERT_EQ(got.size(), static_cast<size_t>(kN));
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(got[i].op, static_cast<uint64_t>(i));
    ASSERT_EQ(got[i].step, static_cast<uint32_t>(i % 7));
  }
  EXPECT_GT(a.frames(), 1);
}

// A member that does not take its events is failed once, loudly, and its
// queue dropped; another member is not affected.
TEST(EventForwarderTest, AMemberPastTheBoundIsFailedOnce) {
  EventForwarder forwarder({.max_queued_events = 4});
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  bool first = true;
  std::vector<absl::Status> failures;
  std::promise<void> failed;
  ASSERT_TRUE(forwarder
                  .Attach(
                      "slow", {0},
                      [&](const FrameBody&) -> absl::Status {
                        if (first) {
                          first = false;
                          entered.set_value();
                          released.wait();
                        }
                        return absl::OkStatus();
                      },
                      [&](const absl::Status& cause) {
                        failures.push_back(absl::Status(
                            cause.code(), std::string(cause.message())));
                        failed.set_value();
                      })
                  .ok());
  FakeMember ok_member;
  ASSERT_TRUE(forwarder
                  .Attach("fine", {1}, ok_member.Sender(), ok_member.OnFail())
                  .ok());
  forwarder.Publish(Step(1, 0, 0), "ns");
  entered.get_future().wait();  // The sender is stuck in the first send.
  for (int i = 0; i < 4; ++i) forwarder.Publish(Step(2 + i, 0, 0), "ns");
  forwarder.Publish(Step(9, 0, 0), "ns");   // The fifth queued: over.
  forwarder.Publish(Step(10, 0, 0), "ns");  // Dropped: already failed.
  forwarder.Publish(Step(11, 1, 0), "ns");  // The other member's.
  release.set_value();
  failed.get_future().wait();
  ASSERT_EQ(ok_member.Await(1).size(), 1u);
  forwarder.Stop();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(failures[0].message().find("slow"), std::string::npos)
      << failures[0];
  EXPECT_EQ(forwarder.stats().members_failed, 1);
}

TEST(EventForwarderTest, AFailedSendFailsTheMemberOnce) {
  EventForwarder forwarder;
  FakeMember a;
  a.FailSends(absl::FailedPreconditionError("link failed"));
  ASSERT_TRUE(forwarder.Attach("a", {0}, a.Sender(), a.OnFail()).ok());
  forwarder.Publish(Step(1, 0, 0), "ns");
  std::vector<absl::Status> failures = a.AwaitFailure();
  forwarder.Publish(Step(2, 0, 0), "ns");
  forwarder.Stop();
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.count(), 0u);
}

// Per-member counters (GroupLeader's status shows them): read while the
// sender is held inside the member's second send, so the first is counted.
TEST(EventForwarderTest, SinkStatsCountEachMembersShare) {
  EventForwarder forwarder;
  // The first send waits for `go`; the second is held until `release`, so
  // when it is entered the first (one event, one frame) was counted.
  std::promise<void> first_entered, go, second_entered, release;
  std::shared_future<void> went = go.get_future().share();
  std::shared_future<void> released = release.get_future().share();
  int sends = 0;  // Only the sender thread touches it.
  absl::StatusOr<uint64_t> held = forwarder.Attach(
      "held", {0},
      [&](const FrameBody&) -> absl::Status {
        if (++sends == 1) {
          first_entered.set_value();
          went.wait();
        } else if (sends == 2) {
          second_entered.set_value();
          released.wait();
        }
        return absl::OkStatus();
      },
      nullptr);
  ASSERT_TRUE(held.ok());
  FakeMember other;
  absl::StatusOr<uint64_t> other_id =
      forwarder.Attach("other", {1}, other.Sender(), other.OnFail());
  ASSERT_TRUE(other_id.ok());
  EXPECT_FALSE(forwarder.sink_stats(*held + *other_id + 100).has_value());

  forwarder.Publish(Step(1, 0, 0), "ns");
  first_entered.get_future().wait();
  forwarder.Publish(Step(2, 0, 0), "ns");  // The second frame.
  go.set_value();
  second_entered.get_future().wait();
  forwarder.Publish(Step(3, 0, 0), "ns");  // Waits behind the held send.
  std::optional<EventForwarder::SinkStats> s = forwarder.sink_stats(*held);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->events_queued, 3);
  EXPECT_EQ(s->events_sent, 1);
  EXPECT_EQ(s->frames_sent, 1);
  EXPECT_EQ(s->events_waiting, 1);
  EXPECT_FALSE(s->failed);
  std::optional<EventForwarder::SinkStats> o = forwarder.sink_stats(*other_id);
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->events_queued, 0);  // Not its rank.
  EXPECT_EQ(o->events_sent, 0);
  release.set_value();
  forwarder.Detach(*held);  // Waits for the held send.
  EXPECT_FALSE(forwarder.sink_stats(*held).has_value());
  forwarder.Stop();
}

TEST(EventForwarderTest, AFailedMembersSinkStatsSayFailed) {
  EventForwarder forwarder;
  FakeMember a;
  a.FailSends(absl::UnavailableError("link failed"));
  absl::StatusOr<uint64_t> id =
      forwarder.Attach("a", {0}, a.Sender(), a.OnFail());
  ASSERT_TRUE(id.ok());
  forwarder.Publish(Step(1, 0, 0), "ns");
  ASSERT_EQ(a.AwaitFailure().size(), 1u);  // on_fail runs after the mark.
  std::optional<EventForwarder::SinkStats> s = forwarder.sink_stats(*id);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->failed);
  EXPECT_EQ(s->events_queued, 1);
  EXPECT_EQ(s->events_sent, 0);
  EXPECT_EQ(s->frames_sent, 0);
  EXPECT_EQ(s->events_waiting, 0);
  forwarder.Stop();
}

TEST(EventForwarderTest, DetachWaitsForItsSendAndStopsDelivery) {
  EventForwarder forwarder;
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> sends{0};
  absl::StatusOr<uint64_t> sink = forwarder.Attach(
      "a", {0},
      [&](const FrameBody&) -> absl::Status {
        if (sends++ == 0) {
          entered.set_value();
          released.wait();
        }
        return absl::OkStatus();
      },
      nullptr);
  ASSERT_TRUE(sink.ok());
  forwarder.Publish(Step(1, 0, 0), "ns");
  entered.get_future().wait();
  std::promise<void> detached;
  std::thread detacher([&] {
    forwarder.Detach(*sink);
    detached.set_value();
  });
  // Detach cannot return while the send runs; it does once it returned.
  release.set_value();
  detached.get_future().wait();
  detacher.join();
  forwarder.Publish(Step(2, 0, 0), "ns");
  forwarder.Stop();
  EXPECT_EQ(sends.load(), 1);
  EXPECT_EQ(forwarder.Attach("b", {1}, nullptr, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace hicache::group
