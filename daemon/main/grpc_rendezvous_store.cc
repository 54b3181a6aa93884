#include "daemon/main/grpc_rendezvous_store.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/main/grpc_support.h"

namespace hicache {
namespace {

namespace pb = ::hicache::internal::v1;

}  // namespace

GrpcRendezvousStore::GrpcRendezvousStore(
    std::shared_ptr<pb::CpGroup::StubInterface> stub,
    GrpcRendezvousStoreOptions options)
    : RendezvousGlooStore(options.timeout),
      stub_(std::move(stub)),
      options_(options) {}

absl::Status GrpcRendezvousStore::Set(const std::string& key,
                                      const std::string& value) {
  pb::RendezvousSetRequest request;
  request.set_key(key);
  request.set_value(value);
  pb::RendezvousSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  return FromGrpcStatus(stub_->RendezvousSet(&context, request, &response));
}

absl::StatusOr<std::string> GrpcRendezvousStore::Get(const std::string& key,
                                                     absl::Duration wait) {
  const absl::Time deadline =
      absl::Now() + std::max(wait, absl::ZeroDuration());
  while (true) {
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    pb::RendezvousGetRequest request;
    request.set_key(key);
    // Rounded up: a wait floored to whole milliseconds would answer
    // NOT_FOUND up to a millisecond before the caller's deadline.
    request.set_wait_ms(static_cast<uint32_t>(std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
        INT32_MAX)));
    pb::RendezvousGetResponse response;
    grpc::ClientContext context;
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + left + options_.rpc_timeout));
    const grpc::Status s = stub_->RendezvousGet(&context, request, &response);
    if (s.ok()) return std::move(*response.mutable_value());
    // NOT_FOUND before our deadline: the server capped the wait (the key
    // may still come). Ask again for the rest; each call blocks server-side.
    if (s.error_code() == grpc::StatusCode::NOT_FOUND &&
        request.wait_ms() > 0 && absl::Now() < deadline) {
      continue;
    }
    return FromGrpcStatus(s);
  }
}

}  // namespace hicache
