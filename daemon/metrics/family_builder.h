#pragma once

#include <string>
#include <utility>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace hicache::metrics {

// Builds the metric families of one scrape (the collectors' Collect):
//   f.Counter("name_total", "help").Sample(3).Sample(4, {{"k", "v"}});
class FamilyBuilder {
 public:
  // Starts a family; the samples that follow belong to it.
  FamilyBuilder& Counter(std::string name, std::string help) {
    return Start(std::move(name), std::move(help),
                 prometheus::MetricType::Counter);
  }
  FamilyBuilder& Gauge(std::string name, std::string help) {
    return Start(std::move(name), std::move(help),
                 prometheus::MetricType::Gauge);
  }
  FamilyBuilder& Sample(
      double value, std::vector<prometheus::ClientMetric::Label> labels = {}) {
    prometheus::ClientMetric metric;
    metric.label = std::move(labels);
    if (out_.back().type == prometheus::MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    out_.back().metric.push_back(std::move(metric));
    return *this;
  }
  std::vector<prometheus::MetricFamily> Take() { return std::move(out_); }

 private:
  FamilyBuilder& Start(std::string name, std::string help,
                       prometheus::MetricType type) {
    prometheus::MetricFamily family;
    family.name = std::move(name);
    family.help = std::move(help);
    family.type = type;
    out_.push_back(std::move(family));
    return *this;
  }

  std::vector<prometheus::MetricFamily> out_;
};

}  // namespace hicache::metrics
