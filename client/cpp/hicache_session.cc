#include "client/cpp/hicache_session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/client_context.h"

namespace hicache::client {
namespace {

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

void Deadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(30));
}

// Calls `rpc` (a fresh context each time) up to 3 times while the daemon is
// UNAVAILABLE (restarting, socket not yet there). Only for idempotent calls.
template <typename Rpc>
grpc::Status WithRetries(Rpc rpc) {
  grpc::Status status;
  absl::Duration backoff = absl::Milliseconds(50);
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext context;
    Deadline(&context);
    status = rpc(&context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
    absl::SleepFor(backoff);
    backoff *= 2;
  }
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MappedSegment>> MappedSegment::Map(
    const v1::PoolSegment& segment) {
  if (segment.kind() != "shm") {
    return absl::UnimplementedError(
        absl::StrCat("cannot map a '", segment.kind(), "' segment here"));
  }
  const int fd = shm_open(segment.name().c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("shm_open ", segment.name(), ": ", std::strerror(errno)));
  }
  void* data = mmap(nullptr, segment.size_bytes(), PROT_READ | PROT_WRITE,
                    MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat("mmap ", segment.name(), ": ", std::strerror(errno)));
  }
  return std::unique_ptr<MappedSegment>(
      new MappedSegment(static_cast<uint8_t*>(data), segment.size_bytes()));
}

MappedSegment::~MappedSegment() { munmap(data_, size_); }

uint64_t BlockBytes(const v1::GetLayoutResponse& layout, int family) {
  return uint64_t{layout.families(family).bytes_per_token()} *
         layout.geometry().page_size_tokens();
}

uint64_t DeviceBlockOffset(const v1::GetLayoutResponse& layout,
                           int64_t physical_page, int family, uint32_t layer) {
  uint64_t prefix = 0;  // Bytes per token of the regions before this one.
  for (int f = 0; f < family; ++f) {
    prefix += uint64_t{layout.families(f).bytes_per_token()} *
              layout.families(f).num_layers();
  }
  prefix += uint64_t{layout.families(family).bytes_per_token()} * layer;
  const uint64_t pages = layout.geometry().device_pages_per_rank();
  return pages * prefix * layout.geometry().page_size_tokens() +
         static_cast<uint64_t>(physical_page) * BlockBytes(layout, family);
}

std::string PackTokens(const std::vector<int32_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()),
                     tokens.size() * sizeof(int32_t));
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(
    std::shared_ptr<v1::HiCache::Stub> stub, const std::string& client_name,
    v1::Role role, uint32_t rank, const std::string& ns, absl::Duration lease) {
  grpc::ClientContext context;
  Deadline(&context);
  v1::OpenSessionRequest request;
  request.set_client_name(client_name);
  request.set_role(role);
  request.set_rank(rank);
  request.set_namespace_(ns);
  request.set_lease_ms(absl::ToInt64Milliseconds(lease));
  v1::OpenSessionResponse response;
  if (absl::Status s = FromGrpc(stub->OpenSession(&context, request, &response),
                                "OpenSession");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Session>(
      new Session(std::move(stub), response.session_id(),
                  absl::Milliseconds(response.lease_ms())));
}

Session::Session(std::shared_ptr<v1::HiCache::Stub> stub, std::string id,
                 absl::Duration lease)
    : stub_(std::move(stub)), id_(std::move(id)) {
  keep_alive_ = std::thread([this, lease] {
    const absl::Duration period = lease / 3;
    absl::Time next = absl::Now() + period;
    while (!closed_.load()) {
      absl::SleepFor(absl::Milliseconds(10));
      if (absl::Now() < next) continue;
      next = absl::Now() + period;
      grpc::ClientContext context;
      Deadline(&context);
      v1::KeepAliveRequest request;
      request.set_session_id(id_);
      v1::KeepAliveResponse response;
      stub_->KeepAlive(&context, request, &response);
    }
  });
}

Session::~Session() { (void)Close(); }

absl::StatusOr<v1::CloseSessionResponse> Session::Close() {
  if (closed_.exchange(true)) return v1::CloseSessionResponse();
  if (keep_alive_.joinable()) keep_alive_.join();
  grpc::ClientContext context;
  Deadline(&context);
  v1::CloseSessionRequest request;
  request.set_session_id(id_);
  v1::CloseSessionResponse response;
  if (absl::Status s = FromGrpc(
          stub_->CloseSession(&context, request, &response), "CloseSession");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::GetLayoutResponse> Session::GetLayout() {
  grpc::ClientContext context;
  Deadline(&context);
  v1::GetLayoutResponse response;
  if (absl::Status s = FromGrpc(
          stub_->GetLayout(&context, v1::GetLayoutRequest(), &response),
          "GetLayout");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::AllocateResponse> Session::Allocate(
    const std::vector<v1::AllocateItem>& items) {
  grpc::ClientContext context;
  Deadline(&context);
  v1::AllocateRequest request;
  request.set_session_id(id_);
  for (const auto& item : items) *request.add_items() = item;
  v1::AllocateResponse response;
  if (absl::Status s =
          FromGrpc(stub_->Allocate(&context, request, &response), "Allocate");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::MatchPrefixResponse> Session::Match(
    const std::vector<std::vector<int32_t>>& requests, bool lock) {
  grpc::ClientContext context;
  Deadline(&context);
  v1::MatchPrefixRequest request;
  request.set_session_id(id_);
  request.set_lock(lock);
  for (const auto& tokens : requests)
    request.add_items()->set_tokens(PackTokens(tokens));
  v1::MatchPrefixResponse response;
  if (absl::Status s = FromGrpc(
          stub_->MatchPrefix(&context, request, &response), "MatchPrefix");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::InsertResponse> Session::Insert(
    const v1::InsertRequest& in) {
  grpc::ClientContext context;
  Deadline(&context);
  v1::InsertRequest request = in;
  request.set_session_id(id_);
  v1::InsertResponse response;
  if (absl::Status s =
          FromGrpc(stub_->Insert(&context, request, &response), "Insert");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::Status Session::Unlock(const std::vector<uint64_t>& nodes) {
  grpc::ClientContext context;
  Deadline(&context);
  v1::LockRequest request;
  request.set_session_id(id_);
  request.mutable_nodes()->Add(nodes.begin(), nodes.end());
  v1::LockResponse response;
  return FromGrpc(stub_->Unlock(&context, request, &response), "Unlock");
}

}  // namespace hicache::client
