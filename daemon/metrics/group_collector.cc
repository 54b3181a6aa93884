#include "daemon/metrics/group_collector.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/metrics/family_builder.h"

namespace hicache::metrics {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// One family per series, filled member by member.
struct MemberSeries {
  const char* name;
  const char* help;
  MetricType type;
  // The value of a member, or nullopt for none.
  std::function<std::optional<double>(const group::GroupMemberStatus&)> value;
};

std::vector<MemberSeries> LeaderSeries() {
  using M = const group::GroupMemberStatus&;
  auto transfer = [](auto field) {
    return [field](M m) -> std::optional<double> {
      if (!m.has_transfer) return std::nullopt;
      return static_cast<double>(m.transfer.*field);
    };
  };
  auto events = [](auto field) {
    return [field](M m) -> std::optional<double> {
      if (!m.has_events) return std::nullopt;
      return static_cast<double>(m.events.*field);
    };
  };
  using T = group::GroupMemberTransfer;
  using E = group::GroupMemberEvents;
  return {
      {"hicache_cp_group_member_live",
       "1 while the member is live, 0 once declared dead.", MetricType::Gauge,
       [](M m) -> std::optional<double> {
         if (m.index == 0) return std::nullopt;  // The leader itself.
         return m.live ? 1.0 : 0.0;
       }},
      {"hicache_cp_group_steps_sent_total", "Copy steps sent to the member.",
       MetricType::Counter, transfer(&T::steps_sent)},
      {"hicache_cp_group_steps_completed_total",
       "Copy steps the member reported done.", MetricType::Counter,
       transfer(&T::steps_completed)},
      {"hicache_cp_group_steps_failed_total",
       "Copy steps failed when the member was lost.", MetricType::Counter,
       transfer(&T::steps_failed)},
      {"hicache_cp_group_steps_outstanding",
       "Copy steps sent to the member and not completed yet.",
       MetricType::Gauge, transfer(&T::outstanding)},
      {"hicache_cp_group_step_timeouts_total",
       "Step deadlines that failed the member.", MetricType::Counter,
       transfer(&T::step_timeouts)},
      {"hicache_cp_group_digests_sent_total",
       "Accounting digests sent to the member.", MetricType::Counter,
       transfer(&T::digests_sent)},
      {"hicache_cp_group_digests_matched_total",
       "Accounting digests the member matched.", MetricType::Counter,
       transfer(&T::digests_matched)},
      {"hicache_cp_group_digest_divergences_total",
       "Accounting digests that diverged (the member was failed).",
       MetricType::Counter, transfer(&T::digest_divergences)},
      {"hicache_cp_group_last_digest_match_age_seconds",
       "Seconds since the member last matched a digest (absent before the "
       "first).",
       MetricType::Gauge,
       [](M m) -> std::optional<double> {
         if (!m.has_transfer ||
             m.transfer.last_digest_match_age == absl::InfiniteDuration()) {
           return std::nullopt;
         }
         return absl::ToDoubleSeconds(m.transfer.last_digest_match_age);
       }},
      {"hicache_cp_group_events_sent_total",
       "Worker events forwarded to the member.", MetricType::Counter,
       events(&E::events_sent)},
      {"hicache_cp_group_events_waiting",
       "Worker events queued for the member, not sent yet.",
       MetricType::Gauge, events(&E::events_waiting)},
  };
}

}  // namespace

std::vector<MetricFamily> GroupCollector::Collect() const {
  if (!status_) return {};
  const std::optional<group::GroupStatus> status = status_();
  if (!status.has_value()) return {};
  return Families(*status);
}

std::vector<MetricFamily> GroupCollector::Families(
    const group::GroupStatus& status) {
  FamilyBuilder f;
  f.Gauge("hicache_cp_group_info",
          "1, labelled with this daemon's role and the group's state.")
      .Sample(1, {{"role", group::GroupRoleName(status.role)},
                  {"state", group::GroupStateName(status.state)}});
  if (status.role == group::GroupRole::kLeader) {
    f.Counter("hicache_cp_group_member_deaths_total", "Members declared dead.")
        .Sample(static_cast<double>(status.deaths));
    for (const MemberSeries& series : LeaderSeries()) {
      FamilyBuilder& family = series.type == MetricType::Counter
                                  ? f.Counter(series.name, series.help)
                                  : f.Gauge(series.name, series.help);
      for (const group::GroupMemberStatus& m : status.members) {
        if (std::optional<double> v = series.value(m); v.has_value()) {
          family.Sample(*v, {{"member", absl::StrCat(m.index)}});
        }
      }
    }
    return f.Take();
  }
  const group::GroupFollowerCounters& c = status.follower;
  f.Counter("hicache_cp_group_follower_tasks_total",
            "Copy tasks received from the leader.")
      .Sample(static_cast<double>(c.tasks_received));
  f.Counter(
       "hicache_cp_group_follower_steps_total",
       "Copy steps from the leader by outcome: executed (completed locally), "
       "refused (failed the checks), rejected (refused by the local engine).")
      .Sample(static_cast<double>(c.steps_executed), {{"outcome", "executed"}})
      .Sample(static_cast<double>(c.steps_refused), {{"outcome", "refused"}})
      .Sample(static_cast<double>(c.steps_rejected), {{"outcome", "rejected"}});
  f.Gauge("hicache_cp_group_follower_steps_pending",
          "Copy steps from the leader not completed yet.")
      .Sample(static_cast<double>(c.pending));
  f.Counter("hicache_cp_group_follower_digests_total",
            "Accounting digests from the leader: checked, and matched.")
      .Sample(static_cast<double>(c.digests_checked), {{"outcome", "checked"}})
      .Sample(static_cast<double>(c.digests_matched), {{"outcome", "matched"}});
  f.Gauge("hicache_cp_group_follower_diverged",
          "1 once a digest from the leader differed from this follower's "
          "tally.")
      .Sample(c.diverged ? 1 : 0);
  f.Counter("hicache_cp_group_follower_acks_total",
            "Worker acks relayed to the leader (relayed), and relayed acks "
            "that did not end OK (failed).")
      .Sample(static_cast<double>(c.acks_relayed), {{"outcome", "relayed"}})
      .Sample(static_cast<double>(c.acks_failed), {{"outcome", "failed"}});
  return f.Take();
}

}  // namespace hicache::metrics
