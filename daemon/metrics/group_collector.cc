#include "daemon/metrics/group_collector.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace hicache::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily family;
  family.name = std::move(name);
  family.help = std::move(help);
  family.type = type;
  return family;
}

void Sample(MetricFamily& family, double value, Labels labels) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

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
  std::vector<MetricFamily> out;
  MetricFamily info =
      Family("hicache_cp_group_info",
             "1, labelled with this daemon's role and the group's state.",
             MetricType::Gauge);
  Sample(info, 1,
         {{"role", group::GroupRoleName(status.role)},
          {"state", group::GroupStateName(status.state)}});
  out.push_back(std::move(info));
  if (status.role == group::GroupRole::kLeader) {
    MetricFamily deaths = Family("hicache_cp_group_member_deaths_total",
                                 "Members declared dead.", MetricType::Counter);
    Sample(deaths, static_cast<double>(status.deaths), {});
    out.push_back(std::move(deaths));
    for (const MemberSeries& series : LeaderSeries()) {
      MetricFamily family = Family(series.name, series.help, series.type);
      for (const group::GroupMemberStatus& m : status.members) {
        if (std::optional<double> v = series.value(m); v.has_value()) {
          Sample(family, *v, {{"member", absl::StrCat(m.index)}});
        }
      }
      out.push_back(std::move(family));
    }
    return out;
  }
  const group::GroupFollowerCounters& c = status.follower;
  MetricFamily tasks = Family("hicache_cp_group_follower_tasks_total",
                              "Copy tasks received from the leader.",
                              MetricType::Counter);
  Sample(tasks, static_cast<double>(c.tasks_received), {});
  out.push_back(std::move(tasks));
  MetricFamily steps = Family(
      "hicache_cp_group_follower_steps_total",
      "Copy steps from the leader by outcome: executed (completed locally), "
      "refused (failed the checks), rejected (refused by the local engine).",
      MetricType::Counter);
  Sample(steps, static_cast<double>(c.steps_executed),
         {{"outcome", "executed"}});
  Sample(steps, static_cast<double>(c.steps_refused), {{"outcome", "refused"}});
  Sample(steps, static_cast<double>(c.steps_rejected),
         {{"outcome", "rejected"}});
  out.push_back(std::move(steps));
  MetricFamily pending =
      Family("hicache_cp_group_follower_steps_pending",
             "Copy steps from the leader not completed yet.", MetricType::Gauge);
  Sample(pending, static_cast<double>(c.pending), {});
  out.push_back(std::move(pending));
  MetricFamily digests = Family(
      "hicache_cp_group_follower_digests_total",
      "Accounting digests from the leader: checked, and matched.",
      MetricType::Counter);
  Sample(digests, static_cast<double>(c.digests_checked),
         {{"outcome", "checked"}});
  Sample(digests, static_cast<double>(c.digests_matched),
         {{"outcome", "matched"}});
  out.push_back(std::move(digests));
  MetricFamily diverged = Family(
      "hicache_cp_group_follower_diverged",
      "1 once a digest from the leader differed from this follower's tally.",
      MetricType::Gauge);
  Sample(diverged, c.diverged ? 1 : 0, {});
  out.push_back(std::move(diverged));
  MetricFamily acks = Family(
      "hicache_cp_group_follower_acks_total",
      "Worker acks relayed to the leader (relayed), and relayed acks that "
      "did not end OK (failed).",
      MetricType::Counter);
  Sample(acks, static_cast<double>(c.acks_relayed), {{"outcome", "relayed"}});
  Sample(acks, static_cast<double>(c.acks_failed), {{"outcome", "failed"}});
  out.push_back(std::move(acks));
  return out;
}

}  // namespace hicache::metrics
