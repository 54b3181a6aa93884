#pragma once

#include "daemon/engine/caller.h"
#include "grpcpp/server_context.h"

namespace hicache::service {

// Tells who makes a call, from what the transport proved about the peer
// (unix peer credentials, a TLS client certificate). Implemented by the
// daemon's listener; the service only asks.
class CallerResolver {
 public:
  virtual ~CallerResolver() = default;
  // Thread-safe. Never fails: an unknown peer is a plain client.
  virtual Caller Resolve(const grpc::ServerContext& context) const = 0;
};

// Every caller is the same, e.g. an operator for an in-process test server.
class FixedCallerResolver final : public CallerResolver {
 public:
  explicit FixedCallerResolver(Caller caller) : caller_(std::move(caller)) {}
  Caller Resolve(const grpc::ServerContext&) const override { return caller_; }

 private:
  const Caller caller_;
};

}  // namespace hicache::service
