#pragma once

#include "daemon/metrics/rpc_metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace hicache::metrics {

// Times every RPC the server runs -- unary calls and streams of every
// registered service, health and reflection included -- into `metrics`: the
// clock starts when gRPC creates the call's interceptors and stops when the
// server sends the status (PRE_SEND_STATUS). A call that ends without a
// status being sent (the server shut down mid-call) is counted as
// CANCELLED when its interceptor is destroyed.
//
// Register with ServerBuilder::experimental().SetInterceptorCreators. The
// metrics must outlive the server.
class RpcInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(RpcMetrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  RpcMetrics* const metrics_;
};

}  // namespace hicache::metrics
