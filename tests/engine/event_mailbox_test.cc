// EventMailbox and EventHub claims: events reach the claiming mailbox in
// order, waiters wake without polling, a full backlog overflows once.
#include "daemon/engine/event_mailbox.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "daemon/engine/event_hub.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(EventMailboxTest, ClaimDeliversQueuedAndLaterEventsInOrder) {
  EventHub hub;
  hub.OnOpEvent(OpEvent::BackupStep(7, 0, 0));  // Before the claim: kept for it.
  auto box = std::make_shared<EventMailbox>(16, nullptr);
  hub.Claim(7, box);
  hub.OnOpEvent(OpEvent::BackupStep(7, 1, 0));
  hub.OnOpEvent(OpEvent::Committed(7, 42));
  hub.OnOpEvent(OpEvent::BackupStep(8, 0, 0));  // Another op: not this mailbox's.
  const absl::Time soon = absl::Now() + absl::Seconds(1);
  EXPECT_EQ(box->Wait(soon)->rank, 0u);
  EXPECT_EQ(box->Wait(soon)->rank, 1u);
  EXPECT_EQ(box->Wait(soon)->type, OpEvent::Type::kCommitted);
  EXPECT_FALSE(box->Wait(absl::Now() + absl::Milliseconds(20)).has_value());
  EXPECT_EQ(hub.Next(8, absl::ZeroDuration())->op, 8u);
  hub.Forget(7);
  EXPECT_EQ(hub.claimed(), 0u);
}

TEST(EventMailboxTest, CloseWakesAnIndefiniteWait) {
  EventMailbox box(16, nullptr);
  std::atomic<bool> woke{false};
  std::thread waiter([&] {
    EXPECT_FALSE(box.Wait(absl::InfiniteFuture()).has_value());
    woke = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(woke.load());  // Still blocked: an infinite wait waits.
  box.Close();
  waiter.join();
  EXPECT_TRUE(woke.load());
}

TEST(EventMailboxTest, OverflowRunsTheCallbackOnceAndDropsEvents) {
  int overflows = 0;
  auto box = std::make_shared<EventMailbox>(2, [&] { ++overflows; });
  EventHub hub;
  hub.Claim(1, box);
  for (uint32_t step = 0; step < 5; ++step) hub.OnOpEvent(OpEvent::BackupStep(1, 0, step));
  EXPECT_EQ(overflows, 1);
  EXPECT_TRUE(box->overflowed());
  EXPECT_FALSE(box->Wait(absl::InfiniteFuture()).has_value());
}

TEST(EventMailboxTest, DisarmedOverflowRunsNothing) {
  int overflows = 0;
  EventMailbox box(1, [&] { ++overflows; });
  box.Disarm();
  box.Deliver({});
  if (box.Deliver({})) box.RunOverflow();
  EXPECT_EQ(overflows, 0);
  EXPECT_TRUE(box.overflowed());
}

}  // namespace
}  // namespace hicache
