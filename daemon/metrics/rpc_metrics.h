#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace hicache::metrics {

// Per-RPC series, labelled by service and method (short names, e.g.
// service="hicache.v1.HiCache", method="MatchPrefix") and gRPC code name:
//   hicache_rpc_duration_seconds{service,method,code}  histogram, from the
//       call's start to its status (a stream's whole life for streams)
//   hicache_rpcs_total{service,method,code}             counter, finished
//   hicache_rpcs_in_flight{service,method}              gauge, running now
// Only the methods named at construction get their own labels; any other
// path (a client probing random names) is counted as service="unknown",
// method="unknown", so clients cannot create series.
//
// Thread-safe (prometheus-cpp metrics are); the registry must outlive it.
class RpcMetrics {
 public:
  // `methods`: full paths, "/package.Service/Method".
  RpcMetrics(prometheus::Registry& registry,
             const std::vector<std::string>& methods);

  // Buckets of the duration histogram, in seconds (50 us .. 60 s).
  static const std::vector<double>& Buckets();

  struct Method;
  // One running call, from Begin to End.
  struct Call {
    Method* method = nullptr;
  };
  Call Begin(const char* path);
  // `code`: a grpc::StatusCode value (unknown values are named by number).
  void End(const Call& call, int code, absl::Duration elapsed);

  // "OK", "INVALID_ARGUMENT", ... for a grpc::StatusCode value.
  static std::string CodeName(int code);

 // The series of one method. After the first call with a code, End finds
  // its series without the family's lock or a label lookup.
  struct Method {
    static constexpr int kCodes = 17;  // grpc::StatusCode 0..16.
    std::string service;
    std::string method;
    prometheus::Gauge* in_flight = nullptr;
    std::atomic<prometheus::Histogram*> duration[kCodes] = {};
    std::atomic<prometheus::Counter*> total[kCodes] = {};
  };

 private:

  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Counter>& total_;
  prometheus::Family<prometheus::Gauge>& in_flight_;
  // Immutable after construction: lookups need no lock.
  absl::flat_hash_map<std::string, std::unique_ptr<Method>> methods_;
  Method unknown_;
};

}  // namespace hicache::metrics
