#include "daemon/main/call_counter.h"

#include "absl/time/clock.h"

namespace hicache {
namespace {

class PerCall final : public grpc::experimental::Interceptor {
 public:
  explicit PerCall(std::shared_ptr<CallCounter> counter)
      : counter_(std::move(counter)) {
    counter_->Add(1);
  }
  ~PerCall() override { counter_->Add(-1); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  const std::shared_ptr<CallCounter> counter_;
};

class Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(std::shared_ptr<CallCounter> counter)
      : counter_(std::move(counter)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* /*info*/) override {
    return new PerCall(counter_);
  }

 private:
  const std::shared_ptr<CallCounter> counter_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CallCounter::MakeFactory() {
  return std::make_unique<Factory>(shared_from_this());
}

void CallCounter::Add(int64_t delta) {
  MutexLock lock(&mu_);
  in_progress_ += delta;
  if (in_progress_ == 0) idle_cv_.SignalAll();
}

int64_t CallCounter::in_progress() const {
  MutexLock lock(&mu_);
  return in_progress_;
}

bool CallCounter::WaitIdle(absl::Time deadline) const {
  MutexLock lock(&mu_);
  while (in_progress_ > 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    idle_cv_.WaitWithTimeout(&mu_, left);
  }
  return in_progress_ == 0;
}

}  // namespace hicache
