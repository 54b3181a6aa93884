#include "daemon/main/grpc_rendezvous_store.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"

namespace hicache {
namespace {

namespace pb = ::hicache::internal::v1;

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

[[noreturn]] void Throw(absl::string_view what, const absl::Status& s) {
  throw gloo::IoException(
      absl::StrCat("CP group rendezvous ", what, ": ", s.ToString()));
}

}  // namespace

GrpcRendezvousStore::GrpcRendezvousStore(
    std::shared_ptr<pb::CpGroup::StubInterface> stub,
    GrpcRendezvousStoreOptions options)
    : stub_(std::move(stub)), options_(options) {}

absl::Status GrpcRendezvousStore::Set(const std::string& key,
                                      const std::string& value) {
  pb::RendezvousSetRequest request;
  request.set_key(key);
  request.set_value(value);
  pb::RendezvousSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  return FromGrpc(stub_->RendezvousSet(&context, request, &response));
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
    request.set_wait_ms(static_cast<uint32_t>(
        std::min<int64_t>(absl::ToInt64Milliseconds(left), INT32_MAX)));
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
    return FromGrpc(s);
  }
}

void GrpcRendezvousStore::set(const std::string& key,
                              const std::vector<char>& data) {
  absl::Status s = Set(key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(absl::StrCat("set \"", absl::CHexEscape(key), "\""), s);
}

std::vector<char> GrpcRendezvousStore::get(const std::string& key) {
  absl::StatusOr<std::string> value = Get(key, options_.timeout);
  if (!value.ok()) {
    Throw(absl::StrCat("get \"", absl::CHexEscape(key), "\""), value.status());
  }
  return std::vector<char>(value->begin(), value->end());
}

void GrpcRendezvousStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::duration_cast<std::chrono::milliseconds>(
                 absl::ToChronoMilliseconds(options_.timeout)));
}

void GrpcRendezvousStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds& timeout) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    absl::StatusOr<std::string> value = Get(key, deadline - absl::Now());
    if (value.ok()) continue;
    if (value.status().code() == absl::StatusCode::kNotFound) {
      // FileStore's message, so logs read alike whatever the store.
      throw gloo::IoException(absl::StrCat(
          "Wait timeout for key(s): ", absl::StrJoin(keys, " "),
          " (CP group rendezvous: ", value.status().message(), ")"));
    }
    Throw(absl::StrCat("wait for \"", absl::CHexEscape(key), "\""),
          value.status());
  }
}

}  // namespace hicache
