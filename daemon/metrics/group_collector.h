#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "daemon/group/group_status.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace hicache::metrics {

// The CP group's health as this daemon sees it (docs/cp-groups.md,
// "Status (GroupStatus)"), read at scrape time from `status` (the daemon
// passes CpGroupRuntime::Status; nullopt: not in a group, no series). On a
// leader, per admitted member (label member="<index>"; names are in
// GetStats, not in labels): liveness, steps sent/completed/failed,
// outstanding, step timeouts, digests sent/matched/diverged, the age of the
// last matching digest, worker events sent and waiting. On a follower: its
// executor's tasks, steps by outcome, digests, divergence, and relayed
// acks by outcome. A member's counters restart from 0 when it is readmitted
// (a new engine), which Prometheus reads as a counter reset.
// docs/metrics.md lists every series.
//
// Thread-safe as `status` is; it is called once per scrape with no lock of
// the collector's held and must outlive the collector (or every Collect()).
class GroupCollector final : public prometheus::Collectable {
 public:
  using StatusFn = std::function<std::optional<group::GroupStatus>()>;

  explicit GroupCollector(StatusFn status) : status_(std::move(status)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

  // The families of one status (Collect without the call; for tests).
  static std::vector<prometheus::MetricFamily> Families(
      const group::GroupStatus& status);

 private:
  const StatusFn status_;
};

}  // namespace hicache::metrics
