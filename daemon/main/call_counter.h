#pragma once

// Counts the gRPC calls in progress (every method, streams included), so
// that shutdown can tell when none is left. MakeFactory() gives the gRPC
// server an interceptor factory; its per-call object lives exactly as long
// as its call and shares ownership of the counter, so the counter outlives
// every call whatever the destruction order.

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "daemon/core/mutex.h"
#include "grpcpp/support/server_interceptor.h"

namespace hicache {

class CallCounter final : public std::enable_shared_from_this<CallCounter> {
 public:
  static std::shared_ptr<CallCounter> Create() {
    return std::shared_ptr<CallCounter>(new CallCounter());
  }

  // For grpc::ServerBuilder::experimental().SetInterceptorCreators.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  MakeFactory();

  int64_t in_progress() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until no call is in progress or `deadline`; whether none is.
  bool WaitIdle(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);

  void Add(int64_t delta) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CallCounter() = default;

  mutable Mutex mu_;
  mutable CondVar idle_cv_;
  int64_t in_progress_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hicache
