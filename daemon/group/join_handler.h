#pragma once

// The two domain interfaces behind the CP group's internal gRPC service
// (daemon/service/cp_group_service.h; docs/cp-groups.md, "Bootstrap: Join
// and rendezvous"). No gRPC here: the service converts and maps codes.
//
//  * JoinHandler: the leader's admission of a member. The service has
//    already decoded the member's geometry and checked the group name.
//  * RendezvousKv: the key/value store both ends of a Gloo link rendezvous
//    through (rendezvous_kv.h is the bounded in-memory one the leader
//    serves; daemon/main/grpc_rendezvous_store.h is the follower's Gloo
//    Store over the RPCs).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/group/group_geometry.h"

namespace hicache::group {

struct JoinReply {
  uint32_t member_index = 0;
  uint64_t epoch = 0;
  // Every rendezvous key of the member's link lies under this prefix.
  std::string rendezvous_prefix;
  std::string leader_name;
};

class JoinHandler {
 public:
  virtual ~JoinHandler() = default;

  // Admits `member_name` with `geometry`. Statuses the service passes on:
  // FAILED_PRECONDITION for a geometry or rank assignment refused for good,
  // UNAVAILABLE for "retry later", INVALID_ARGUMENT, ALREADY_EXISTS and
  // RESOURCE_EXHAUSTED; any other code reaches the member as INTERNAL.
  // Called from gRPC threads concurrently.
  virtual absl::StatusOr<JoinReply> Join(const std::string& member_name,
                                         const GroupGeometry& geometry) = 0;
};

class RendezvousKv {
 public:
  virtual ~RendezvousKv() = default;

  // Stores `value` under `key`. Setting a key again with the same value is
  // OK and changes nothing; with a different value ALREADY_EXISTS (a key is
  // written once: a peer cannot overwrite another's address).
  // INVALID_ARGUMENT for an empty key; RESOURCE_EXHAUSTED when the key, the
  // value or the store would exceed the implementation's bounds.
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // The value under `key`, waiting up to `wait` (capped by the
  // implementation) for it to be set. NOT_FOUND if still absent then;
  // RESOURCE_EXHAUSTED if too many callers already wait; CANCELLED once the
  // store shuts down.
  virtual absl::StatusOr<std::string> Get(absl::string_view key,
                                          absl::Duration wait) = 0;
};

}  // namespace hicache::group
