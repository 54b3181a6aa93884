#include "daemon/service/cp_group_service.h"

#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/group/group_geometry.h"
#include "daemon/service/proto_convert.h"

namespace hicache::service {
namespace {

namespace pb = ::hicache::internal::v1;

grpc::Status Grpc(grpc::StatusCode code, absl::string_view message) {
  return grpc::Status(code, std::string(message));
}

// `s` as is when its code is one of `passed`; otherwise INTERNAL naming
// `what` and carrying `s`.
grpc::Status PassOrInternal(const absl::Status& s,
                            std::initializer_list<absl::StatusCode> passed,
                            absl::string_view what) {
  for (absl::StatusCode code : passed) {
    if (s.code() == code) return ToGrpcStatus(s);
  }
  return Grpc(grpc::StatusCode::INTERNAL,
              absl::StrCat(what, ": ", s.ToString()));
}

grpc::Status MapJoinStatus(const absl::Status& s) {
  return PassOrInternal(
      s,
      {absl::StatusCode::kFailedPrecondition, absl::StatusCode::kUnavailable,
       absl::StatusCode::kInvalidArgument, absl::StatusCode::kAlreadyExists,
       absl::StatusCode::kResourceExhausted},
      "CP group join failed");
}

grpc::Status MapKvStatus(const absl::Status& s) {
  // A store shutting down: the leader is going away.
  if (s.code() == absl::StatusCode::kCancelled) {
    return Grpc(grpc::StatusCode::UNAVAILABLE, s.message());
  }
  return PassOrInternal(
      s,
      {absl::StatusCode::kInvalidArgument, absl::StatusCode::kResourceExhausted,
       absl::StatusCode::kAlreadyExists, absl::StatusCode::kNotFound},
      "rendezvous store");
}

}  // namespace

CpGroupService::CpGroupService(std::string group, group::JoinHandler* handler,
                               group::RendezvousKv* kv,
                               const CallerResolver* members)
    : group_(std::move(group)), handler_(handler), kv_(kv), members_(members) {}

grpc::Status CpGroupService::CheckCaller(
    const grpc::ServerContext* context) const {
  if (members_ == nullptr) return grpc::Status::OK;
  if (context == nullptr) {
    return Grpc(grpc::StatusCode::PERMISSION_DENIED,
                "the CP group service needs an authenticated caller");
  }
  const Caller caller = members_->Resolve(*context);
  if (caller.is_operator) return grpc::Status::OK;
  return Grpc(grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat("the CP group service is for the group's daemons "
                           "(operators: a TLS client certificate named in "
                           "--operator_cert_names); ",
                           absl::CHexEscape(caller.name), " is not one"));
}

grpc::Status CpGroupService::Join(grpc::ServerContext* context,
                                  const pb::JoinRequest* request,
                                  pb::JoinResponse* response) {
  if (grpc::Status caller = CheckCaller(context); !caller.ok()) return caller;
  if (request->member_name().empty() ||
      request->member_name().size() > kMaxNameBytes) {
    return Grpc(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("CP group member name must have 1 to ", kMaxNameBytes,
                     " bytes, got ", request->member_name().size()));
  }
  if (request->advertise_address().size() > kMaxNameBytes ||
      request->group().size() > kMaxNameBytes) {
    return Grpc(grpc::StatusCode::INVALID_ARGUMENT,
                absl::StrCat("CP group name and advertise address may have "
                             "at most ",
                             kMaxNameBytes, " bytes"));
  }
  if (request->geometry().size() > kMaxGeometryBytes) {
    return Grpc(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("CP group geometry of ", request->geometry().size(),
                     " bytes exceeds ", kMaxGeometryBytes));
  }
  const std::string member = absl::CHexEscape(request->member_name());
  if (request->group() != group_) {
    return Grpc(grpc::StatusCode::FAILED_PRECONDITION,
                absl::StrCat("member \"", member, "\" asks to join CP group \"",
                             absl::CHexEscape(request->group()),
                             "\"; this leader leads CP group \"",
                             absl::CHexEscape(group_), "\""));
  }
  absl::StatusOr<group::GroupGeometry> geometry =
      group::DecodeGroupGeometry(request->geometry());
  if (!geometry.ok()) {
    return Grpc(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("geometry of CP group member \"", member,
                     "\" does not decode: ", geometry.status().message()));
  }
  absl::StatusOr<group::JoinReply> reply =
      handler_->Join(request->member_name(), *geometry);
  if (!reply.ok()) return MapJoinStatus(reply.status());
  response->set_member_index(reply->member_index);
  response->set_epoch(reply->epoch);
  response->set_rendezvous_prefix(reply->rendezvous_prefix);
  response->set_leader_name(reply->leader_name);
  return grpc::Status::OK;
}

grpc::Status CpGroupService::RendezvousSet(
    grpc::ServerContext* context, const pb::RendezvousSetRequest* request,
    pb::RendezvousSetResponse* /*response*/) {
  if (grpc::Status caller = CheckCaller(context); !caller.ok()) return caller;
  absl::Status s = kv_->Set(request->key(), request->value());
  if (!s.ok()) return MapKvStatus(s);
  return grpc::Status::OK;
}

grpc::Status CpGroupService::RendezvousGet(
    grpc::ServerContext* context, const pb::RendezvousGetRequest* request,
    pb::RendezvousGetResponse* response) {
  if (grpc::Status caller = CheckCaller(context); !caller.ok()) return caller;
  absl::Duration wait = absl::Milliseconds(request->wait_ms());
  // Never wait past the caller's own deadline: it would not see the answer.
  if (context != nullptr) {
    const absl::Time deadline = absl::FromChrono(context->deadline());
    const absl::Duration left = deadline - absl::Now();
    if (left < wait)
      wait = left < absl::ZeroDuration() ? absl::ZeroDuration() : left;
  }
  absl::StatusOr<std::string> value = kv_->Get(request->key(), wait);
  if (!value.ok()) return MapKvStatus(value.status());
  *response->mutable_value() = *std::move(value);
  return grpc::Status::OK;
}

}  // namespace hicache::service
