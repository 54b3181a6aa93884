#include "client/cpp/hicache_session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/leader_redirect.h"
#include "grpcpp/client_context.h"

namespace hicache::client {
namespace {

void Deadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(30));
}

// One unary call with a fresh context and the 30 s deadline; `call(context,
// &response)` makes it.
template <typename Response, typename Call>
absl::StatusOr<Response> Unary(absl::string_view what, Call call) {
  grpc::ClientContext context;
  Deadline(&context);
  Response response;
  if (absl::Status s = StatusOfCall(call(&context, &response), context, what);
      !s.ok()) {
    return s;
  }
  return response;
}

absl::Status CallUnlock(v1::HiCache::Stub& stub,
                        const v1::LockRequest& request) {
  return Unary<v1::LockResponse>("Unlock",
                                 [&](grpc::ClientContext* c, auto* r) {
                                   return stub.Unlock(c, request, r);
                                 })
      .status();
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

v1::AdmitItem MakeAdmitItem(const std::vector<int32_t>& tokens,
                            int64_t reserve_tokens, v1::ComputeOwnerMode mode,
                            v1::BackupChoice backup, bool unfinished) {
  v1::AdmitItem item;
  item.set_tokens(PackTokens(tokens));
  item.set_reserve_tokens(reserve_tokens);
  item.set_mode(mode);
  item.set_backup(backup);
  item.set_unfinished(unfinished);
  return item;
}

v1::CompleteItem MakeCompleteItem(const v1::AdmitResult& admitted,
                                  const std::vector<int32_t>& tokens,
                                  uint32_t page_size, bool unfinished) {
  v1::CompleteItem item;
  item.set_tokens(PackTokens(tokens));
  item.set_unfinished(unfinished);
  item.set_backup_id(admitted.backup_id());
  if (admitted.lock_handle() != 0) item.add_lock_handles(admitted.lock_handle());
  item.set_free_uncached(true);
  const size_t cached =
      page_size == 0 ? 0 : (tokens.size() + page_size - 1) / page_size;
  size_t index = 0;
  auto place = [&](int64_t page) {
    if (index++ < cached) {
      item.add_pages(page);
    } else {
      item.add_free_pages(page);
    }
  };
  for (int64_t page : admitted.device().pages()) place(page);
  for (int64_t page : admitted.pages()) place(page);
  return item;
}

absl::StatusOr<std::unique_ptr<Session>> Session::Open(
    std::shared_ptr<v1::HiCache::Stub> stub, const std::string& client_name,
    v1::Role role, uint32_t rank, const std::string& ns, absl::Duration lease,
    absl::Duration wait_for_daemon) {
  grpc::ClientContext context;
  if (wait_for_daemon > absl::ZeroDuration()) {
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(absl::Now() + wait_for_daemon));
  } else {
    Deadline(&context);
  }
  v1::OpenSessionRequest request;
  request.set_client_name(client_name);
  request.set_role(role);
  request.set_rank(rank);
  request.set_namespace_(ns);
  request.set_lease_ms(absl::ToInt64Milliseconds(lease));
  v1::OpenSessionResponse response;
  if (absl::Status s = StatusOfCall(
          stub->OpenSession(&context, request, &response), context,
          "OpenSession");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Session>(
      new Session(std::move(stub), response.session_id(),
                  absl::Milliseconds(response.lease_ms())));
}

absl::StatusOr<std::unique_ptr<Session>> Session::OpenAt(
    const std::string& target, const ChannelOptions& options,
    const std::string& client_name, v1::Role role, uint32_t rank,
    const std::string& ns, absl::Duration lease,
    absl::Duration wait_for_daemon, std::string* opened_at) {
  auto open = [&](const std::string& at)
      -> absl::StatusOr<std::unique_ptr<Session>> {
    // The TCP options are the leader's: a scheduler reaching its local
    // follower on a unix socket follows the redirect to a TCP leader with
    // them, and the unix hop takes none.
    ChannelOptions for_target = options;
    if (absl::StartsWith(at, "unix:")) {
      for_target = ChannelOptions{.wait_for_ready = options.wait_for_ready};
    }
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        HiCacheClient::NewChannel(at, for_target);
    if (!channel.ok()) return channel.status();
    return Open(v1::HiCache::NewStub(*std::move(channel)), client_name, role,
                rank, ns, lease, wait_for_daemon);
  };
  absl::StatusOr<std::unique_ptr<Session>> first = open(target);
  if (first.ok() || !LeaderOf(first.status()).has_value()) {
    if (first.ok() && opened_at != nullptr) *opened_at = target;
    return first;
  }
  const std::string leader = *LeaderOf(first.status());
  absl::StatusOr<std::unique_ptr<Session>> second = open(leader);
  if (second.ok()) {
    if (opened_at != nullptr) *opened_at = leader;
    return second;
  }
  if (std::optional<std::string> again = LeaderOf(second.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "OpenSession: ", target, " is not the CP group leader and named ",
        leader, ", which is not the leader either and named ", *again,
        "; not followed (at most one hop)"));
  }
  return absl::Status(
      second.status().code(),
      absl::StrCat("OpenSession at the CP group leader ", leader,
                   " (named by ", target, "): ", second.status().message()));
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
  v1::CloseSessionRequest request;
  request.set_session_id(id_);
  return Unary<v1::CloseSessionResponse>(
      "CloseSession", [&](grpc::ClientContext* c, auto* r) {
        return stub_->CloseSession(c, request, r);
      });
}

absl::StatusOr<v1::GetLayoutResponse> Session::GetLayout() {
  // Retried by gRPC on UNAVAILABLE where the stub's channel carries the
  // client service config (HiCacheClient::NewChannel).
  return Unary<v1::GetLayoutResponse>(
      "GetLayout", [&](grpc::ClientContext* c, auto* r) {
        return stub_->GetLayout(c, v1::GetLayoutRequest(), r);
      });
}

absl::StatusOr<v1::AllocateResponse> Session::Allocate(
    const std::vector<v1::AllocateItem>& items) {
  v1::AllocateRequest request;
  request.set_session_id(id_);
  for (const auto& item : items) *request.add_items() = item;
  return Unary<v1::AllocateResponse>(
      "Allocate", [&](grpc::ClientContext* c, auto* r) {
        return stub_->Allocate(c, request, r);
      });
}

absl::Status Session::Free(const std::vector<int64_t>& pages) {
  v1::FreeRequest request;
  request.set_session_id(id_);
  request.mutable_pages()->Add(pages.begin(), pages.end());
  return Unary<v1::FreeResponse>("Free",
                                 [&](grpc::ClientContext* c, auto* r) {
                                   return stub_->Free(c, request, r);
                                 })
      .status();
}

absl::StatusOr<v1::MatchPrefixResponse> Session::MatchPrefix(
    const std::vector<std::vector<int32_t>>& requests,
    const MatchOptions& options) {
  v1::MatchPrefixRequest request;
  request.set_session_id(id_);
  request.set_lock(options.lock);
  request.set_peek(options.peek);
  request.set_exact_tail(options.exact_tail);
  for (const auto& tokens : requests) {
    request.add_items()->set_tokens(PackTokens(tokens));
  }
  v1::MatchPrefixResponse response;
  grpc::ClientContext context;
  Deadline(&context);
  // Without a lock a match changes nothing but hit counts: it may wait for
  // a daemon that is restarting (the request is sent once connected). A
  // locking one fails fast. Neither is retried once sent (see
  // RetriedReadMethods() in client/cpp/endpoint.h).
  if (!options.lock) context.set_wait_for_ready(true);
  if (absl::Status s = StatusOfCall(
          stub_->MatchPrefix(&context, request, &response), context,
          "MatchPrefix");
      !s.ok()) {
    return s;
  }
  return response;
}

absl::StatusOr<v1::MatchPrefixResponse> Session::Match(
    const std::vector<std::vector<int32_t>>& requests, bool lock) {
  return MatchPrefix(requests, {.lock = lock});
}

std::vector<uint64_t> Session::LockHandles(
    const v1::MatchPrefixResponse& response) {
  std::vector<uint64_t> handles;
  for (const v1::MatchResult& result : response.results()) {
    if (result.lock_handle() != 0) handles.push_back(result.lock_handle());
  }
  return handles;
}

absl::StatusOr<v1::InsertResponse> Session::Insert(
    const v1::InsertRequest& in) {
  v1::InsertRequest request = in;
  request.set_session_id(id_);
  return Unary<v1::InsertResponse>(
      "Insert", [&](grpc::ClientContext* c, auto* r) {
        return stub_->Insert(c, request, r);
      });
}

absl::StatusOr<std::vector<uint64_t>> Session::Lock(
    const std::vector<uint64_t>& nodes) {
  v1::LockRequest request;
  request.set_session_id(id_);
  request.mutable_nodes()->Add(nodes.begin(), nodes.end());
  absl::StatusOr<v1::LockResponse> response = Unary<v1::LockResponse>(
      "Lock", [&](grpc::ClientContext* c, auto* r) {
        return stub_->Lock(c, request, r);
      });
  if (!response.ok()) return response.status();
  return std::vector<uint64_t>(response->lock_handles().begin(),
                               response->lock_handles().end());
}

absl::Status Session::UnlockHandles(const std::vector<uint64_t>& handles) {
  v1::LockRequest request;
  request.set_session_id(id_);
  request.mutable_lock_handles()->Add(handles.begin(), handles.end());
  return CallUnlock(*stub_, request);
}

absl::Status Session::Unlock(const std::vector<uint64_t>& nodes) {
  v1::LockRequest request;
  request.set_session_id(id_);
  request.mutable_nodes()->Add(nodes.begin(), nodes.end());
  return CallUnlock(*stub_, request);
}

absl::StatusOr<v1::AdmitResponse> Session::Admit(
    const std::vector<v1::AdmitItem>& items) {
  v1::AdmitRequest request;
  request.set_session_id(id_);
  request.mutable_items()->Add(items.begin(), items.end());
  return Unary<v1::AdmitResponse>(
      "Admit", [&](grpc::ClientContext* c, auto* r) {
        return stub_->Admit(c, request, r);
      });
}

absl::StatusOr<v1::CompleteResponse> Session::Complete(
    const std::vector<v1::CompleteItem>& items) {
  v1::CompleteRequest request;
  request.set_session_id(id_);
  request.mutable_items()->Add(items.begin(), items.end());
  return Unary<v1::CompleteResponse>(
      "Complete", [&](grpc::ClientContext* c, auto* r) {
        return stub_->Complete(c, request, r);
      });
}

absl::StatusOr<std::unique_ptr<LoadStream>> Session::StartLoadBack(
    const v1::LoadBackRequest& in) {
  v1::LoadBackRequest request = in;
  request.set_session_id(id_);
  auto stream = std::make_unique<LoadStream>();
  stream->name_ = "LoadBack";
  stream->reader_ = stub_->LoadBack(&stream->context_, request);
  return stream;
}

namespace {

// Runs a LoadBack of `num_items` items (30 s deadline) to its end.
absl::StatusOr<std::vector<LoadResult>> RunLoads(
    v1::HiCache::Stub& stub, const v1::LoadBackRequest& request,
    int num_items) {
  grpc::ClientContext context;
  Deadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::LoadBackEvent>> stream =
      stub.LoadBack(&context, request);
  std::vector<LoadResult> results(num_items);
  std::vector<bool> started(num_items, false);
  std::vector<bool> done(num_items, false);
  std::map<uint64_t, int> item_of_load;
  v1::LoadBackEvent event;
  absl::Status bad;
  while (stream->Read(&event)) {
    if (event.has_started()) {
      const uint32_t item = event.started().item();
      if (item >= results.size()) {
        bad = absl::InternalError(absl::StrCat("LoadBack: started of item ",
                                               item, " of ", num_items));
        continue;
      }
      results[item].started = event.started();
      started[item] = true;
      if (event.started().load_id() != 0) {
        item_of_load[event.started().load_id()] = static_cast<int>(item);
      }
    } else if (event.has_layer_loaded()) {
      auto it = item_of_load.find(event.layer_loaded().load_id());
      if (it != item_of_load.end()) ++results[it->second].layers_loaded;
    } else if (event.has_done()) {
      const uint32_t item = event.done().item();
      if (item >= results.size()) {
        bad = absl::InternalError(absl::StrCat("LoadBack: done of item ",
                                               item, " of ", num_items));
        continue;
      }
      results[item].done = event.done();
      done[item] = true;
    }
  }
  if (absl::Status s = StatusOfCall(stream->Finish(), context, "LoadBack");
      !s.ok()) {
    return s;
  }
  if (!bad.ok()) return bad;
  for (int i = 0; i < num_items; ++i) {
    if (!started[i] || !done[i]) {
      return absl::InternalError(
          absl::StrCat("LoadBack: the stream ended without ",
                       started[i] ? "done" : "started", " of item ", i));
    }
  }
  return results;
}

}  // namespace

absl::StatusOr<LoadResult> Session::LoadBack(
    const std::vector<int32_t>& tokens, int64_t extend_tokens) {
  v1::LoadBackRequest request;
  request.set_session_id(id_);
  request.set_tokens(PackTokens(tokens));
  request.set_extend_tokens(extend_tokens);
  absl::StatusOr<std::vector<LoadResult>> results =
      RunLoads(*stub_, request, 1);
  if (!results.ok()) return results.status();
  return std::move(results->front());
}

absl::StatusOr<std::vector<LoadResult>> Session::LoadBack(
    const std::vector<LoadItem>& items) {
  if (items.empty()) return std::vector<LoadResult>();
  v1::LoadBackRequest request;
  request.set_session_id(id_);
  for (const LoadItem& item : items) {
    v1::LoadItem* out = request.add_items();
    out->set_tokens(PackTokens(item.tokens));
    out->set_extend_tokens(item.extend_tokens);
  }
  return RunLoads(*stub_, request, static_cast<int>(items.size()));
}

absl::Status Session::FinishLoad(uint64_t load_id) {
  v1::FinishLoadRequest request;
  request.set_session_id(id_);
  request.set_load_id(load_id);
  return Unary<v1::FinishLoadResponse>(
             "FinishLoad",
             [&](grpc::ClientContext* c, auto* r) {
               return stub_->FinishLoad(c, request, r);
             })
      .status();
}

absl::StatusOr<std::unique_ptr<WorkerEvents>> Session::Subscribe() {
  v1::SubscribeRequest request;
  request.set_session_id(id_);
  auto stream = std::make_unique<WorkerEvents>();
  stream->name_ = "Subscribe";
  stream->reader_ = stub_->Subscribe(&stream->context_, request);
  v1::WorkerEvent first;
  if (!stream->Next(&first)) {
    absl::Status s = stream->Finish();
    if (!s.ok()) return s;
    return absl::InternalError("Subscribe: the stream ended at once");
  }
  if (!first.has_subscribed()) {
    return absl::InternalError(absl::StrCat(
        "Subscribe: the first event is not 'subscribed': ",
        first.ShortDebugString()));
  }
  return stream;
}

absl::StatusOr<uint64_t> Session::RegisterFence(
    uint32_t rank, const std::string& event_handle) {
  v1::RegisterFenceRequest request;
  request.set_session_id(id_);
  request.set_rank(rank);
  request.set_event_handle(event_handle);
  absl::StatusOr<v1::RegisterFenceResponse> response =
      Unary<v1::RegisterFenceResponse>(
          "RegisterFence", [&](grpc::ClientContext* c, auto* r) {
            return stub_->RegisterFence(c, request, r);
          });
  if (!response.ok()) return response.status();
  return response->fence_id();
}

absl::Status Session::ReleaseFence(uint64_t fence_id) {
  v1::ReleaseFenceRequest request;
  request.set_session_id(id_);
  request.set_fence_id(fence_id);
  return Unary<v1::ReleaseFenceResponse>(
             "ReleaseFence",
             [&](grpc::ClientContext* c, auto* r) {
               return stub_->ReleaseFence(c, request, r);
             })
      .status();
}

absl::StatusOr<std::unique_ptr<BackupStream>> Session::OpenBackupStream() {
  std::unique_ptr<BackupStream> stream(new BackupStream(id_));
  stream->stream_ = stub_->BackupSession(&stream->context_);
  return stream;
}

}  // namespace hicache::client
