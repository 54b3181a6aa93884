#include "daemon/metrics/rpc_metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hicache::metrics {
namespace {

constexpr const char* kCodeNames[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

}  // namespace

const std::vector<double>& RpcMetrics::Buckets() {
  static const std::vector<double>* const buckets = new std::vector<double>{
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   60};
  return *buckets;
}

std::string RpcMetrics::CodeName(int code) {
  if (code >= 0 && code < static_cast<int>(std::size(kCodeNames))) {
    return kCodeNames[code];
  }
  return absl::StrCat("CODE_", code);
}

RpcMetrics::RpcMetrics(prometheus::Registry& registry,
                       const std::vector<std::string>& methods)
    : duration_(prometheus::BuildHistogram()
                    .Name("hicache_rpc_duration_seconds")
                    .Help("gRPC calls: time from the call's start to its "
                          "status (streams: their whole life).")
                    .Register(registry)),
      total_(prometheus::BuildCounter()
                 .Name("hicache_rpcs_total")
                 .Help("gRPC calls finished, by method and status code.")
                 .Register(registry)),
      in_flight_(prometheus::BuildGauge()
                     .Name("hicache_rpcs_in_flight")
                     .Help("gRPC calls running now (open streams included).")
                     .Register(registry)) {
  for (const std::string& path : methods) {
    absl::string_view rest = path;
    if (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
    const size_t slash = rest.find('/');
    auto method = std::make_unique<Method>();
    method->service = std::string(rest.substr(0, slash));
    method->method = slash == absl::string_view::npos
                         ? ""
                         : std::string(rest.substr(slash + 1));
    method->in_flight = &in_flight_.Add(
        {{"service", method->service}, {"method", method->method}});
    methods_[path] = std::move(method);
  }
  unknown_.service = "unknown";
  unknown_.method = "unknown";
  unknown_.in_flight =
      &in_flight_.Add({{"service", "unknown"}, {"method", "unknown"}});
}

RpcMetrics::Call RpcMetrics::Begin(const char* path) {
  auto it = path == nullptr ? methods_.end() : methods_.find(path);
  Method* method = it == methods_.end() ? &unknown_ : it->second.get();
  method->in_flight->Increment();
  return Call{method};
}

void RpcMetrics::End(const Call& call, int code, absl::Duration elapsed) {
  Method& method = *call.method;
  method.in_flight->Decrement();
  prometheus::Histogram* duration = nullptr;
  prometheus::Counter* total = nullptr;
  const bool cached = code >= 0 && code < Method::kCodes;
  if (cached) {
    duration = method.duration[code].load(std::memory_order_acquire);
    total = method.total[code].load(std::memory_order_acquire);
  }
  if (duration == nullptr || total == nullptr) {
    // Family::Add returns the existing series for known labels, so threads
    // that race here store the same pointers.
    const prometheus::Labels labels = {{"service", method.service},
                                       {"method", method.method},
                                       {"code", CodeName(code)}};
    duration = &duration_.Add(labels, Buckets());
    total = &total_.Add(labels);
    if (cached) {
      method.duration[code].store(duration, std::memory_order_release);
      method.total[code].store(total, std::memory_order_release);
    }
  }
  duration->Observe(absl::ToDoubleSeconds(elapsed));
  total->Increment();
}

}  // namespace hicache::metrics
