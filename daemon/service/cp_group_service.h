#pragma once

// CpGroupService: the gRPC face of a CP group leader's bootstrap
// (proto/hicache/internal/v1/cp_group.proto; docs/cp-groups.md,
// "Bootstrap: Join and rendezvous"). Thin: it checks request bounds,
// decodes the member's geometry, checks the group name, calls the
// JoinHandler or the RendezvousKv and maps their statuses to gRPC codes.
//
// Status mapping:
//  * Join: request bounds and undecodable geometry -> INVALID_ARGUMENT;
//    another group -> FAILED_PRECONDITION; the handler's
//    FAILED_PRECONDITION, UNAVAILABLE, INVALID_ARGUMENT, ALREADY_EXISTS,
//    RESOURCE_EXHAUSTED pass through; any other code -> INTERNAL.
//  * Rendezvous: the store's codes pass through (INVALID_ARGUMENT,
//    RESOURCE_EXHAUSTED, ALREADY_EXISTS, NOT_FOUND, CANCELLED -> UNAVAILABLE
//    since the leader is going away); any other -> INTERNAL.
//
// Internal only: the group's daemons call it, not cache clients (see
// `members` below).
// The handler and the store are not owned and must outlive the service.

#include <cstdint>
#include <string>

#include "daemon/group/join_handler.h"
#include "daemon/service/caller_resolver.h"
#include "grpcpp/grpcpp.h"
#include "hicache/internal/v1/cp_group.grpc.pb.h"

namespace hicache::service {

class CpGroupService final : public hicache::internal::v1::CpGroup::Service {
 public:
  // Bytes of a member name or advertise address.
  static constexpr size_t kMaxNameBytes = 256;
  // Bytes of the geometry of a Join (a generous bound over its encoding).
  static constexpr size_t kMaxGeometryBytes = 64 << 10;

  // `members`: when set, only callers it resolves as operators may call
  // (PERMISSION_DENIED otherwise, nothing changed): the group's daemons
  // prove themselves with a TLS client certificate named in
  // --operator_cert_names. nullptr: any caller (tests, and
  // --insecure_tcp_for_testing). Not owned.
  CpGroupService(std::string group, group::JoinHandler* handler,
                 group::RendezvousKv* kv,
                 const CallerResolver* members = nullptr);

  grpc::Status Join(grpc::ServerContext* context,
                    const hicache::internal::v1::JoinRequest* request,
                    hicache::internal::v1::JoinResponse* response) override;
  grpc::Status RendezvousSet(
      grpc::ServerContext* context,
      const hicache::internal::v1::RendezvousSetRequest* request,
      hicache::internal::v1::RendezvousSetResponse* response) override;
  grpc::Status RendezvousGet(
      grpc::ServerContext* context,
      const hicache::internal::v1::RendezvousGetRequest* request,
      hicache::internal::v1::RendezvousGetResponse* response) override;

 private:
  const std::string group_;
  group::JoinHandler* const handler_;
  group::RendezvousKv* const kv_;
  const CallerResolver* const members_;

  // OK when the caller may use the service.
  grpc::Status CheckCaller(const grpc::ServerContext* context) const;
};

}  // namespace hicache::service
