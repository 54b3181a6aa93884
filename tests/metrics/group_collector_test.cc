// GroupCollector: the CP group's series from a GroupStatus -- per member on
// a leader (label member), the executor's and relayed acks' on a follower,
// nothing outside a group.
#include "daemon/metrics/group_collector.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace hicache::metrics {
namespace {

using prometheus::MetricFamily;

const MetricFamily* Find(const std::vector<MetricFamily>& families,
                         const std::string& name) {
  for (const MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The value of `name`'s sample whose label `key` is `value` (or the only
// sample when key is empty); nullopt when none.
std::optional<double> Value(const std::vector<MetricFamily>& families,
                            const std::string& name, const std::string& key,
                            const std::string& value) {
  const MetricFamily* f = Find(families, name);
  if (f == nullptr) return std::nullopt;
  for (const prometheus::ClientMetric& m : f->metric) {
    bool match = key.empty();
    for (const auto& label : m.label) {
      if (label.name == key && label.value == value) match = true;
    }
    if (!match) continue;
    return f->type == prometheus::MetricType::Counter ? m.counter.value
                                                      : m.gauge.value;
  }
  return std::nullopt;
}

group::GroupStatus Leader() {
  group::GroupStatus status{.name = "g",
                            .role = group::GroupRole::kLeader,
                            .state = group::GroupState::kDegraded,
                            .deaths = 1};
  status.members.push_back({.index = 0, .name = "leader"});
  group::GroupMemberStatus b{.index = 1, .name = "b", .live = true};
  b.has_transfer = true;
  b.transfer = {.steps_sent = 10,
                .steps_completed = 9,
                .outstanding = 1,
                .digests_sent = 3,
                .digests_matched = 3,
                .last_digest_match_age = absl::Milliseconds(1500)};
  b.has_events = true;
  b.events = {.events_sent = 40, .events_waiting = 2};
  status.members.push_back(b);
  group::GroupMemberStatus c{.index = 2, .name = "c", .live = false};
  c.has_transfer = true;
  c.transfer = {.steps_sent = 4, .steps_completed = 1, .steps_failed = 3,
                .step_timeouts = 1};
  status.members.push_back(c);
  return status;
}

TEST(GroupCollectorTest, NotInAGroupNoSeries) {
  EXPECT_TRUE(GroupCollector(nullptr).Collect().empty());
  GroupCollector none([] { return std::optional<group::GroupStatus>(); });
  EXPECT_TRUE(none.Collect().empty());
}

TEST(GroupCollectorTest, LeaderSeriesPerMember) {
  int calls = 0;
  GroupCollector collector([&]() -> std::optional<group::GroupStatus> {
    ++calls;
    return Leader();
  });
  const std::vector<MetricFamily> f = collector.Collect();
  EXPECT_EQ(calls, 1);
  const MetricFamily* info = Find(f, "hicache_cp_group_info");
  ASSERT_NE(info, nullptr);
  ASSERT_EQ(info->metric.size(), 1u);
  EXPECT_EQ(info->metric[0].label.size(), 2u);
  EXPECT_EQ(info->metric[0].label[0].value, "leader");
  EXPECT_EQ(info->metric[0].label[1].value, "degraded");
  EXPECT_EQ(Value(f, "hicache_cp_group_member_deaths_total", "", ""), 1);
  // The leader itself has no member series.
  EXPECT_EQ(Value(f, "hicache_cp_group_member_live", "member", "0"),
            std::nullopt);
  EXPECT_EQ(Value(f, "hicache_cp_group_steps_sent_total", "member", "0"),
            std::nullopt);
  EXPECT_EQ(Value(f, "hicache_cp_group_member_live", "member", "1"), 1);
  EXPECT_EQ(Value(f, "hicache_cp_group_member_live", "member", "2"), 0);
  EXPECT_EQ(Value(f, "hicache_cp_group_steps_sent_total", "member", "1"), 10);
  EXPECT_EQ(Value(f, "hicache_cp_group_steps_completed_total", "member", "1"),
            9);
  EXPECT_EQ(Value(f, "hicache_cp_group_steps_outstanding", "member", "1"), 1);
  EXPECT_EQ(Value(f, "hicache_cp_group_digests_matched_total", "member", "1"),
            3);
  EXPECT_EQ(
      Value(f, "hicache_cp_group_digest_divergences_total", "member", "1"), 0);
  EXPECT_EQ(Value(f, "hicache_cp_group_last_digest_match_age_seconds",
                  "member", "1"),
            1.5);
  // Never matched: no age sample.
  EXPECT_EQ(Value(f, "hicache_cp_group_last_digest_match_age_seconds",
                  "member", "2"),
            std::nullopt);
  EXPECT_EQ(Value(f, "hicache_cp_group_steps_failed_total", "member", "2"), 3);
  EXPECT_EQ(Value(f, "hicache_cp_group_step_timeouts_total", "member", "2"),
            1);
  EXPECT_EQ(Value(f, "hicache_cp_group_events_sent_total", "member", "1"), 40);
  EXPECT_EQ(Value(f, "hicache_cp_group_events_waiting", "member", "1"), 2);
  EXPECT_EQ(Value(f, "hicache_cp_group_events_sent_total", "member", "2"),
            std::nullopt);  // No events forwarded to it.
  EXPECT_EQ(Find(f, "hicache_cp_group_follower_steps_total"), nullptr);
  // Counter families are named *_total, gauges are not.
  for (const MetricFamily& family : f) {
    const bool total = family.name.size() > 6 &&
                       family.name.substr(family.name.size() - 6) == "_total";
    EXPECT_EQ(total, family.type == prometheus::MetricType::Counter)
        << family.name;
  }
}

TEST(GroupCollectorTest, FollowerSeries) {
  group::GroupStatus status{.name = "g",
                            .role = group::GroupRole::kFollower,
                            .state = group::GroupState::kFormed};
  status.members.push_back({.index = 0, .name = "l:1", .live = true});
  status.follower = {.tasks_received = 5,
                     .steps_executed = 20,
                     .steps_refused = 1,
                     .steps_rejected = 2,
                     .pending = 3,
                     .digests_checked = 4,
                     .digests_matched = 4,
                     .diverged = true,
                     .acks_relayed = 7,
                     .acks_failed = 1};
  const std::vector<MetricFamily> f = GroupCollector::Families(status);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_tasks_total", "", ""), 5);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_steps_total", "outcome",
                  "executed"),
            20);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_steps_total", "outcome",
                  "refused"),
            1);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_steps_total", "outcome",
                  "rejected"),
            2);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_steps_pending", "", ""), 3);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_digests_total", "outcome",
                  "matched"),
            4);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_diverged", "", ""), 1);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_acks_total", "outcome",
                  "relayed"),
            7);
  EXPECT_EQ(Value(f, "hicache_cp_group_follower_acks_total", "outcome",
                  "failed"),
            1);
  // No per-member leader series on a follower.
  EXPECT_EQ(Find(f, "hicache_cp_group_steps_sent_total"), nullptr);
  EXPECT_EQ(Find(f, "hicache_cp_group_member_deaths_total"), nullptr);
}

}  // namespace
}  // namespace hicache::metrics
