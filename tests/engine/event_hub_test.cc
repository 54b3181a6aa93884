// EventHub: events reach the stream that claims their operation, and the
// operations nobody streams cannot grow it without bound -- without ever
// dropping the events of an operation still running (issue 12, item 9).
#include "daemon/engine/event_hub.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/engine/event_mailbox.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

TEST(EventHubTest, ARunningOpsEventsSurviveManyFinishedOps) {
  EventHub hub;
  // A load starts; its first layer completes before its stream claims it.
  hub.OnOpEvent(OpEvent::LoadStep(/*op=*/1, /*rank=*/0, /*step=*/0, "fence"));
  // Meanwhile far more write-through backups than kMaxOps start and finish
  // with nobody streaming them.
  for (uint64_t op = 2; op < 2 + 3 * EventHub::kMaxOps; ++op) {
    hub.OnOpEvent(OpEvent::BackupStep(op, 0, 0));
    hub.OnOpEvent(OpEvent::Committed(op, /*node=*/7));
  }
  auto box = std::make_shared<EventMailbox>(16, [] {});
  hub.Claim(1, box);
  std::optional<OpEvent> first = box->Wait(absl::Now());
  ASSERT_TRUE(first.has_value()) << "the running load's event was dropped";
  EXPECT_EQ(first->type, OpEvent::Type::kLoadStep);
  EXPECT_EQ(first->fence, "fence");
  hub.OnOpEvent(OpEvent::LoadDone(1, true));
  std::optional<OpEvent> done = box->Wait(absl::Now());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->type, OpEvent::Type::kLoadDone);
  hub.Forget(1);
}

TEST(EventHubTest, FinishedUnclaimedOpsAreBounded) {
  EventHub hub;
  for (uint64_t op = 1; op <= 3 * EventHub::kMaxOps; ++op) {
    hub.OnOpEvent(OpEvent::BackupStep(op, 0, 0));
    hub.OnOpEvent(OpEvent::RolledBack(op));
  }
  // The oldest finished ones are gone, the newest still there.
  EXPECT_FALSE(hub.Next(1, absl::ZeroDuration()).has_value());
  std::optional<OpEvent> newest =
      hub.Next(3 * EventHub::kMaxOps, absl::ZeroDuration());
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->type, OpEvent::Type::kBackupStep);
}

TEST(EventHubTest, ClaimedAndForgottenOpsLeaveNothingBehind) {
  EventHub hub;
  for (uint64_t op = 1; op <= 3 * EventHub::kMaxOps; ++op) {
    hub.OnOpEvent(OpEvent::Committed(op, 1));
    hub.Forget(op);  // A stream that saw it through.
  }
  hub.OnOpEvent(OpEvent::BackupStep(99999, 0, 0));
  EXPECT_TRUE(hub.Next(99999, absl::ZeroDuration()).has_value());
  EXPECT_EQ(hub.claimed(), 0u);
}

// The CP group leader's tap sees exactly what is fanned out to subscribers:
// tagged ops' events (replayed ones included) with their namespace, once
// each, whether or not a local subscriber matched; untagged ops never.
TEST(EventHubTest, SubscriberTapSeesWhatIsFannedOut) {
  EventHub hub;
  std::vector<std::pair<OpEvent, std::string>> tapped;
  hub.SetSubscriberTap([&](const OpEvent& event, const std::string& ns) {
    tapped.emplace_back(event, ns);
  });
  hub.OnOpEvent(OpEvent::BackupStep(/*op=*/1, /*rank=*/0, /*step=*/0));  // Untagged: none.
  EXPECT_TRUE(tapped.empty());
  hub.OnOpEvent(OpEvent::LoadStep(/*op=*/2, /*rank=*/1, /*step=*/0, "f"));
  hub.Tag(2, "ns");  // Replays the queued step.
  ASSERT_EQ(tapped.size(), 1u);
  EXPECT_EQ(tapped[0].first.type, OpEvent::Type::kLoadStep);
  EXPECT_EQ(tapped[0].first.fence, "f");
  EXPECT_EQ(tapped[0].second, "ns");
  // Two local subscribers: still one tap call per event.
  hub.Subscribe(1, "ns", std::make_shared<EventMailbox>(16, [] {}));
  hub.Subscribe(0, "ns", std::make_shared<EventMailbox>(16, [] {}));
  hub.OnOpEvent(OpEvent::LoadDone(2, false));
  ASSERT_EQ(tapped.size(), 2u);
  EXPECT_EQ(tapped[1].first.type, OpEvent::Type::kLoadDone);
  EXPECT_FALSE(tapped[1].first.ok);
  hub.OnOpEvent(OpEvent::LoadDone(2, true));  // The tag is gone after the terminal event.
  EXPECT_EQ(tapped.size(), 2u);
}

}  // namespace
}  // namespace hicache
