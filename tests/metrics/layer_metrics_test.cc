// LayerMetrics fed by a real engine through EngineOptions::observer, and by
// hand for the edge cases.
#include "daemon/metrics/layer_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/metrics/engine_rig.h"

namespace hicache::metrics {
namespace {

// sample_count of the histogram `name` with exactly `labels`.
uint64_t Count(prometheus::Registry& registry, const std::string& name,
               const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> have;
      for (const auto& label : metric.label) have[label.name] = label.value;
      if (have == labels) return metric.histogram.sample_count;
    }
  }
  ADD_FAILURE() << "no " << name;
  return 0;
}

TEST(LayerMetricsTest, TheEngineReportsEveryLayerCopyOfBackupsAndLoads) {
  prometheus::Registry registry;
  LayerMetrics layers(registry);
  testing::EngineRig rig(&layers);
  const uint32_t steps = rig.engine().geometry().NumSteps();
  ASSERT_GE(steps, 1u);
  rig.Cache("ns", testing::Tokens(0, 12));
  // One copy per (rank, step): the backup's pages sit on both lanes only if
  // they were allocated there, but every served rank acks every step.
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds", {{"op", "backup"}}),
            2 * steps);
  EXPECT_EQ(Count(registry, "hicache_layer_ready_seconds",
                  {{"op", "backup"}, {"layer", "first"}}),
            2u);
  EXPECT_EQ(Count(registry, "hicache_layer_ready_seconds",
                  {{"op", "backup"}, {"layer", "last"}}),
            2u);
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds", {{"op", "load"}}),
            0u);

  rig.EvictAndLoad("ns", testing::Tokens(0, 12));
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds", {{"op", "load"}}),
            2 * steps);
  EXPECT_EQ(Count(registry, "hicache_layer_ready_seconds",
                  {{"op", "load"}, {"layer", "last"}}),
            2u);
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds",
                  {{"op", "write_back"}}),
            0u);
}

TEST(LayerMetricsTest, FailedCopiesAreNotTimedAndOneStepIsFirstAndLast) {
  prometheus::Registry registry;
  LayerMetrics layers(registry);
  LayerCopyEvent event{.kind = LayerCopyEvent::Kind::kBackup,
                       .write_back = true,
                       .step = 0,
                       .num_steps = 1,
                       .ok = false,
                       .since_start = absl::Milliseconds(2),
                       .since_submit = absl::Milliseconds(1)};
  layers.OnLayerCopy(event);
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds",
                  {{"op", "write_back"}}),
            0u);
  event.ok = true;
  layers.OnLayerCopy(event);
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds",
                  {{"op", "write_back"}}),
            1u);
  EXPECT_EQ(Count(registry, "hicache_layer_ready_seconds",
                  {{"op", "write_back"}, {"layer", "first"}}),
            1u);
  EXPECT_EQ(Count(registry, "hicache_layer_ready_seconds",
                  {{"op", "write_back"}, {"layer", "last"}}),
            1u);
  // A middle step of a longer op is neither first nor last.
  event.step = 1;
  event.num_steps = 3;
  layers.OnLayerCopy(event);
  EXPECT_EQ(Count(registry, "hicache_layer_copy_seconds",
                  {{"op", "write_back"}}),
            2u);
  EXPECT_EQ(Count(registry, "hicache_layer_ready_seconds",
                  {{"op", "write_back"}, {"layer", "last"}}),
            1u);
}

}  // namespace
}  // namespace hicache::metrics
