#include "daemon/metrics/rpc_interceptor.h"

#include <atomic>

#include "absl/time/clock.h"
#include "grpcpp/support/status.h"

namespace hicache::metrics {
namespace {

using grpc::experimental::InterceptionHookPoints;

class RpcInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(RpcMetrics* metrics, const char* method)
      : metrics_(metrics), call_(metrics->Begin(method)), start_(absl::Now()) {}

  ~RpcInterceptor() override {
    End(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
                       InterceptionHookPoints::PRE_SEND_STATUS)) {
      End(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  // Counts the call once, whichever comes first.
  void End(grpc::StatusCode code) {
    if (ended_.exchange(true)) return;
    metrics_->End(call_, static_cast<int>(code), absl::Now() - start_);
  }

  RpcMetrics* const metrics_;
  const RpcMetrics::Call call_;
  const absl::Time start_;
  // A stream's reads and writes may be intercepted on different threads.
  std::atomic<bool> ended_{false};
};

}  // namespace

grpc::experimental::Interceptor* RpcInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new RpcInterceptor(metrics_, info->method());
}

}  // namespace hicache::metrics
