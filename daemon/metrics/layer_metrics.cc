#include "daemon/metrics/layer_metrics.h"

#include "absl/time/time.h"

namespace hicache::metrics {
namespace {

constexpr const char* kOpNames[] = {"load", "backup", "write_back"};

int OpIndex(const LayerCopyEvent& event) {
  if (event.kind == LayerCopyEvent::Kind::kLoad) return 0;
  return event.write_back ? 2 : 1;
}

}  // namespace

const std::vector<double>& LayerMetrics::Buckets() {
  static const std::vector<double>* const buckets = new std::vector<double>{
      0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
      0.005,   0.01,     0.025,   0.05,   0.1,     0.25,   0.5,   1,
      2.5,     5,        10,      30};
  return *buckets;
}

LayerMetrics::LayerMetrics(prometheus::Registry& registry) {
  auto& copy = prometheus::BuildHistogram()
                   .Name("hicache_layer_copy_seconds")
                   .Help("One layer's copy of a backup or load on one rank, "
                         "from its submission to its completion.")
                   .Register(registry);
  auto& ready = prometheus::BuildHistogram()
                    .Name("hicache_layer_ready_seconds")
                    .Help("From a backup's or load's start to the completion "
                          "of its first or last layer on one rank.")
                    .Register(registry);
  for (int op = 0; op < kOps; ++op) {
    copy_[op] = &copy.Add({{"op", kOpNames[op]}}, Buckets());
    first_[op] = &ready.Add({{"op", kOpNames[op]}, {"layer", "first"}},
                            Buckets());
    last_[op] = &ready.Add({{"op", kOpNames[op]}, {"layer", "last"}},
                           Buckets());
  }
}

void LayerMetrics::OnLayerCopy(const LayerCopyEvent& event) {
  if (!event.ok) return;
  const int op = OpIndex(event);
  copy_[op]->Observe(absl::ToDoubleSeconds(event.since_submit));
  const double since_start = absl::ToDoubleSeconds(event.since_start);
  if (event.step == 0) first_[op]->Observe(since_start);
  if (event.num_steps > 0 && event.step + 1 == event.num_steps) {
    last_[op]->Observe(since_start);
  }
}

}  // namespace hicache::metrics
