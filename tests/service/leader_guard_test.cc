// The CP group leader guard (daemon/service/leader_guard.h, rpc_scope.h):
// every RPC of the proto is classified; on a follower every tree RPC is
// refused with the hicache-leader trailer and changes nothing, while the
// worker-facing RPCs are served; a standalone daemon (no LeaderView) and the
// leader serve everything.

#include "daemon/service/leader_guard.h"

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "daemon/core/clock.h"
#include "daemon/core/mutex.h"
#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/group/leader_view.h"
#include "daemon/service/hicache_service.h"
#include "daemon/service/rpc_scope.h"
#include "daemon/service/watch_broadcaster.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"

namespace hicache::service {
namespace {

constexpr char kLeader[] = "leader.example:7443";

class FakeRole : public LeaderView {
 public:
  explicit FakeRole(bool leader, std::string address = kLeader)
      : leader_(leader), address_(std::move(address)) {}
  bool IsLeader() const override { return leader_.load(); }
  std::string LeaderAddress() const override { return address_; }
  void set_leader(bool leader) { leader_.store(leader); }

 private:
  std::atomic<bool> leader_;
  const std::string address_;
};

std::vector<std::string> ProtoMethods() {
  const google::protobuf::ServiceDescriptor* service =
      v1::GetStatsRequest::descriptor()->file()->FindServiceByName("HiCache");
  std::vector<std::string> out;
  for (int i = 0; i < service->method_count(); ++i) {
    out.push_back(service->method(i)->name());
  }
  return out;
}

TEST(RpcScopeTest, EveryRpcOfTheProtoIsClassifiedOnce) {
  const std::vector<std::string> methods = ProtoMethods();
  ASSERT_GT(methods.size(), 20u);
  for (const std::string& method : methods) {
    EXPECT_TRUE(ScopeOfRpc(method).has_value())
        << method << " is not in rpc_scope.h: say whether a CP group "
        << "follower may serve it";
  }
  std::set<std::string_view> seen;
  for (const RpcScopeEntry& entry : kHiCacheRpcScopes) {
    EXPECT_TRUE(seen.insert(entry.method).second) << entry.method << " twice";
    EXPECT_NE(std::find(methods.begin(), methods.end(),
                        std::string(entry.method)),
              methods.end())
        << entry.method << " is not an RPC of the proto";
  }
  EXPECT_EQ(seen.size(), methods.size());
  EXPECT_FALSE(ScopeOfRpc("NoSuchRpc").has_value());
}

TEST(RpcScopeTest, TreeAndWorkerRpcsAreWhereTheIssueSays) {
  for (const char* tree :
       {"Allocate", "Free", "MatchPrefix", "Insert", "Lock", "Unlock", "Admit",
        "Complete", "LoadBack", "FinishLoad", "Pin", "Evict", "SetFreeRoom",
        "SetQuota", "ListQuotas", "DumpTree", "InspectNode", "Stats", "Watch"}) {
    EXPECT_EQ(ScopeOfRpc(tree), RpcScope::kTree) << tree;
  }
  for (const char* local : {"GetStats", "GetLayout", "KeepAlive",
                            "CloseSession", "RegisterFence", "ReleaseFence",
                            "Subscribe", "ListSessions"}) {
    EXPECT_EQ(ScopeOfRpc(local), RpcScope::kLocal) << local;
  }
  EXPECT_EQ(ScopeOfRpc("OpenSession"), RpcScope::kByRole);
  EXPECT_EQ(ScopeOfRpc("BackupSession"), RpcScope::kByRole);
}

TEST(LeaderTargetTest, AcceptsHostPortTargetsOnly) {
  for (const char* good :
       {"leader:7443", "10.0.0.1:1", "a-b.c.example:65535", "[::1]:5000",
        "[fe80::1]:80", "dns:///leader.example:443"}) {
    EXPECT_TRUE(IsValidLeaderTarget(good)) << good;
  }
  const std::string too_long = std::string(kMaxLeaderAddressBytes, 'a') + ":1";
  for (const std::string& bad : std::vector<std::string>{
           "", "leader", "leader:", ":7443", "leader:0", "leader:65536",
           "leader:99999999999", "leader:-1", "leader:+80", "unix:/tmp/x.sock",
           "unix-abstract:x", "ipv4:1.2.3.4:5", "dns://evil/leader:1",
           "user@leader:1", "leader:1/path", "-leader:1", ".leader:1",
           "lead er:1", std::string("lead\0er:1", 9), "leader:1\n",
           "le\x7f" "ader:1", "[]:1", "[::1:1", "[zz::1]:1", "http://x:1",
           too_long}) {
    EXPECT_FALSE(IsValidLeaderTarget(bad)) << bad;
  }
  EXPECT_TRUE(IsValidLeaderTarget(
      std::string(kMaxLeaderAddressBytes - 2, 'a') + ":1"));
}

TEST(LeaderGuardTest, LocalRpcsAreAProgrammingError) {
  FakeRole role(false);
  LeaderGuard guard(&role);
  grpc::ServerContext context;
  EXPECT_EQ(guard.Check(&context, "GetLayout").error_code(),
            grpc::StatusCode::INTERNAL);
  EXPECT_EQ(guard.Check(&context, "Bogus").error_code(),
            grpc::StatusCode::INTERNAL);
  LeaderGuard standalone(nullptr);
  EXPECT_TRUE(standalone.Check(&context, "Insert").ok());
  EXPECT_EQ(standalone.Check(&context, "KeepAlive").error_code(),
            grpc::StatusCode::INTERNAL);
}

// A daemon's service behind an in-process server.
class GuardedServiceTest : public ::testing::Test {
 protected:
  void Start(const LeaderView* role) {
    auto engine = HiCacheEngine::Create({.device_pages_per_rank = 8,
                                         .host_pages_per_rank = 8});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    sessions_ = std::make_unique<SessionManager>(engine_.get(), &clock_,
                                                 absl::Minutes(1));
    DaemonInfo info{};
    info.build.cuda_support = false;  // No default member initializer.
    info.config.cp_size = 1;
    service_ = std::make_unique<HiCacheService>(
        info, &clock_,
        ServiceParts{.engine = engine_.get(),
                     .sessions = sessions_.get(),
                     .hub = &hub_,
                     .watch = &watch_,
                     .group = role});
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = server_->InProcessChannel(grpc::ChannelArguments());
    stub_ = v1::HiCache::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Calls `method` with an empty request (one message, then half-close) and
  // reads to the end; returns the status and the hicache-leader trailers.
  grpc::Status CallRaw(const std::string& method,
                       std::vector<std::string>* leaders) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic.PrepareCall(&context, "/hicache.v1.HiCache/" + method, &cq);
    void* tag = nullptr;
    bool ok = false;
    call->StartCall(reinterpret_cast<void*>(1));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    call->WritesDone(reinterpret_cast<void*>(3));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    grpc::ByteBuffer response;
    do {
      call->Read(&response, reinterpret_cast<void*>(4));
      EXPECT_TRUE(cq.Next(&tag, &ok));
    } while (ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    EXPECT_TRUE(cq.Next(&tag, &ok));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    Trailers(context, leaders);
    return status;
  }

  static void Trailers(const grpc::ClientContext& context,
                       std::vector<std::string>* leaders) {
    leaders->clear();
    const auto& trailers = context.GetServerTrailingMetadata();
    auto [begin, end] = trailers.equal_range(kLeaderTrailer);
    for (auto it = begin; it != end; ++it) {
      leaders->emplace_back(it->second.data(), it->second.size());
    }
  }

  std::string OpenSession(v1::Role role, grpc::Status* status,
                          std::vector<std::string>* leaders) {
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_client_name("test");
    request.set_role(role);
    request.set_lease_ms(60000);
    v1::OpenSessionResponse response;
    *status = stub_->OpenSession(&context, request, &response);
    Trailers(context, leaders);
    return response.session_id();
  }

  FakeClock clock_{absl::FromUnixSeconds(1'700'000'000)};
  std::unique_ptr<HiCacheEngine> engine_;
  std::unique_ptr<SessionManager> sessions_;
  EventHub hub_;
  WatchBroadcaster watch_;
  std::unique_ptr<HiCacheService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

TEST_F(GuardedServiceTest, FollowerRefusesEveryTreeRpcWithTheLeader) {
  FakeRole role(false);
  Start(&role);
  for (const RpcScopeEntry& entry : kHiCacheRpcScopes) {
    if (entry.scope != RpcScope::kTree) continue;
    std::vector<std::string> leaders;
    const grpc::Status status = CallRaw(std::string(entry.method), &leaders);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << entry.method << ": " << status.error_message();
    EXPECT_EQ(status.error_message(),
              std::string("not the CP group leader; the leader is ") + kLeader)
        << entry.method;
    EXPECT_EQ(leaders, std::vector<std::string>{kLeader}) << entry.method;
  }
}

TEST_F(GuardedServiceTest, FollowerServesLocalRpcsWithoutRedirect) {
  FakeRole role(false);
  Start(&role);
  for (const RpcScopeEntry& entry : kHiCacheRpcScopes) {
    if (entry.scope != RpcScope::kLocal) continue;
    std::vector<std::string> leaders;
    const grpc::Status status = CallRaw(std::string(entry.method), &leaders);
    EXPECT_TRUE(leaders.empty()) << entry.method;
    EXPECT_EQ(status.error_message().find("CP group leader"),
              std::string::npos)
        << entry.method << ": " << status.error_message();
    // A local RPC that calls the guard by mistake is INTERNAL everywhere.
    EXPECT_EQ(status.error_message().find("rpc_scope.h"), std::string::npos)
        << entry.method;
  }
  // Served for real: GetStats, GetLayout, a worker session and its
  // keep-alive.
  grpc::ClientContext stats_context;
  v1::GetStatsResponse stats;
  const grpc::Status stats_status =
      stub_->GetStats(&stats_context, v1::GetStatsRequest(), &stats);
  EXPECT_TRUE(stats_status.ok())
      << stats_status.error_code() << " " << stats_status.error_message();
  grpc::ClientContext layout_context;
  v1::GetLayoutResponse layout;
  ASSERT_TRUE(
      stub_->GetLayout(&layout_context, v1::GetLayoutRequest(), &layout).ok());
  EXPECT_GT(layout.bytes_per_page(), 0u);
  grpc::Status status;
  std::vector<std::string> leaders;
  const std::string worker = OpenSession(v1::ROLE_WORKER, &status, &leaders);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(leaders.empty());
  grpc::ClientContext keep_context;
  v1::KeepAliveRequest keep;
  keep.set_session_id(worker);
  v1::KeepAliveResponse kept;
  EXPECT_TRUE(stub_->KeepAlive(&keep_context, keep, &kept).ok());
  EXPECT_EQ(sessions_->List().size(), 1u);
}

TEST_F(GuardedServiceTest, SchedulerOpenSessionIsRedirectedAndOpensNothing) {
  FakeRole role(false);
  Start(&role);
  grpc::Status status;
  std::vector<std::string> leaders;
  EXPECT_TRUE(OpenSession(v1::ROLE_SCHEDULER, &status, &leaders).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(leaders, std::vector<std::string>{kLeader});
  EXPECT_TRUE(sessions_->List().empty());
}

// A tree made on the leader; the same daemon as a follower refuses real
// requests of a real session and nothing changes.
TEST_F(GuardedServiceTest, RefusedTreeRpcsChangeNothing) {
  FakeRole role(true);
  Start(&role);
  grpc::Status status;
  std::vector<std::string> leaders;
  const std::string session =
      OpenSession(v1::ROLE_SCHEDULER, &status, &leaders);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const uint32_t page_size = engine_->options().page_size;
  std::vector<int32_t> tokens(page_size);
  for (uint32_t i = 0; i < page_size; ++i) tokens[i] = static_cast<int>(i);
  const std::string packed(reinterpret_cast<const char*>(tokens.data()),
                           tokens.size() * sizeof(int32_t));
  auto allocate = [&](grpc::ClientContext* context, v1::AllocateResponse* out) {
    v1::AllocateRequest request;
    request.set_session_id(session);
    request.add_items()->set_num_pages(1);
    return stub_->Allocate(context, request, out);
  };
  auto insert = [&](grpc::ClientContext* context, int64_t page) {
    v1::InsertRequest request;
    request.set_session_id(session);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(packed);
    item->add_pages(page);
    v1::InsertResponse response;
    return stub_->Insert(context, request, &response);
  };
  {
    grpc::ClientContext a, i;
    v1::AllocateResponse pages;
    ASSERT_TRUE(allocate(&a, &pages).ok());
    ASSERT_TRUE(insert(&i, pages.allocations(0).pages(0)).ok());
  }
  const TreeStats before = engine_->TreeStatistics();
  const EngineStats engine_before = engine_->Stats();
  ASSERT_EQ(before.nodes, 1);

  role.set_leader(false);
  auto expect_redirect = [&](const grpc::ClientContext& context,
                             const grpc::Status& s, const char* what) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << what;
    Trailers(context, &leaders);
    EXPECT_EQ(leaders, std::vector<std::string>{kLeader}) << what;
  };
  {
    grpc::ClientContext context;
    v1::AllocateResponse pages;
    expect_redirect(context, allocate(&context, &pages), "Allocate");
  }
  {
    grpc::ClientContext context;
    expect_redirect(context, insert(&context, 0), "Insert");
  }
  {
    grpc::ClientContext context;
    v1::MatchPrefixRequest request;
    request.set_session_id(session);
    request.add_items()->set_tokens(packed);
    request.set_lock(true);
    v1::MatchPrefixResponse response;
    expect_redirect(context, stub_->MatchPrefix(&context, request, &response),
                    "MatchPrefix");
  }
  {
    grpc::ClientContext context;
    v1::EvictRequest request;
    request.add_device_pages_per_lane(8);
    v1::EvictResponse response;
    expect_redirect(context, stub_->Evict(&context, request, &response),
                    "Evict");
  }
  {
    grpc::ClientContext context;
    auto stream = stub_->BackupSession(&context);
    v1::BackupClientMessage prepare;
    prepare.set_session_id(session);
    prepare.mutable_prepare()->add_specs()->add_pages(0);
    stream->Write(prepare);
    stream->WritesDone();
    v1::BackupServerMessage ignored;
    while (stream->Read(&ignored)) {
    }
    expect_redirect(context, stream->Finish(), "BackupSession prepare");
  }
  const TreeStats after = engine_->TreeStatistics();
  EXPECT_EQ(after.nodes, before.nodes);
  EXPECT_EQ(after.device_tokens, before.device_tokens);
  EXPECT_EQ(after.protected_tokens, before.protected_tokens);
  EXPECT_EQ(after.pending_backups, before.pending_backups);
  EXPECT_EQ(engine_->Stats().match_calls, engine_before.match_calls);

  // Back as the leader, the same calls are served.
  role.set_leader(true);
  grpc::ClientContext context;
  v1::MatchPrefixRequest request;
  request.set_session_id(session);
  request.add_items()->set_tokens(packed);
  v1::MatchPrefixResponse response;
  ASSERT_TRUE(stub_->MatchPrefix(&context, request, &response).ok());
  EXPECT_EQ(engine_->Stats().match_calls, engine_before.match_calls + 1);
}

TEST_F(GuardedServiceTest, StandaloneServesTreeRpcs) {
  Start(nullptr);
  grpc::Status status;
  std::vector<std::string> leaders;
  EXPECT_FALSE(OpenSession(v1::ROLE_SCHEDULER, &status, &leaders).empty());
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(leaders.empty());
  for (const RpcScopeEntry& entry : kHiCacheRpcScopes) {
    if (entry.scope != RpcScope::kTree) continue;
    const grpc::Status s = CallRaw(std::string(entry.method), &leaders);
    EXPECT_TRUE(leaders.empty()) << entry.method;
    EXPECT_EQ(s.error_message().find("CP group leader"), std::string::npos)
        << entry.method;
    EXPECT_EQ(s.error_message().find("rpc_scope.h"), std::string::npos)
        << entry.method;
  }
}

TEST_F(GuardedServiceTest, UnknownOrInvalidLeaderSendsNoTrailer) {
  FakeRole unknown(false, "");
  Start(&unknown);
  grpc::Status status;
  std::vector<std::string> leaders;
  OpenSession(v1::ROLE_SCHEDULER, &status, &leaders);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(leaders.empty());
  server_->Shutdown();
  server_.reset();

  FakeRole invalid(false, "unix:/tmp/evil.sock");
  Start(&invalid);
  OpenSession(v1::ROLE_SCHEDULER, &status, &leaders);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(leaders.empty());
  EXPECT_EQ(status.error_message().find("evil"), std::string::npos);
  EXPECT_TRUE(sessions_->List().empty());
}

// ---- Worker acks on a CP group follower (docs/cp-groups.md, "Worker events
// and acks across the link") ----

// A follower whose relay records what it was given.
class RelayingRole : public FakeRole {
 public:
  struct Call {
    std::string ns;
    Rank rank;
    uint32_t step;
    std::vector<uint64_t> ops;
  };
  RelayingRole() : FakeRole(false) {}
  absl::Status ForwardLayerStored(
      const std::string& ns, Rank rank, uint32_t step,
      absl::Span<const uint64_t> ops,
      absl::Span<const RankFence> fences) const override {
    MutexLock lock(&mu_);
    calls_.push_back({ns, rank, step, {ops.begin(), ops.end()}});
    if (!fences.empty()) return absl::InternalError("fences reached the relay");
    return answer_;
  }
  std::vector<Call> calls() const {
    MutexLock lock(&mu_);
    return calls_;
  }
  void set_answer(absl::Status answer) {
    MutexLock lock(&mu_);
    answer_ = answer;
  }

 private:
  mutable Mutex mu_;
  mutable std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
  absl::Status answer_ ABSL_GUARDED_BY(mu_);
};

class FollowerAckTest : public GuardedServiceTest {
 protected:
  std::string OpenAs(v1::Role role, uint32_t rank, const std::string& ns) {
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_client_name("test");
    request.set_role(role);
    request.set_rank(rank);
    request.set_namespace_(ns);
    request.set_lease_ms(60000);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&context, request, &response).ok());
    return response.session_id();
  }
  // One layer_stored on a BackupSession stream; the error it got, if any
  // (code 0: none).
  v1::BackupServerMessage::Error LayerStored(const std::string& session,
                                             std::vector<uint64_t> ids,
                                             uint32_t step, bool fence) {
    grpc::ClientContext context;
    auto stream = stub_->BackupSession(&context);
    v1::BackupClientMessage message;
    message.set_session_id(session);
    for (uint64_t id : ids) message.mutable_layer_stored()->add_backup_ids(id);
    message.mutable_layer_stored()->set_step(step);
    if (fence) {
      v1::RankFence* f = message.mutable_layer_stored()->add_fences();
      f->set_rank(0);
      f->set_fence_id(1);
    }
    stream->Write(message);
    stream->WritesDone();
    v1::BackupServerMessage::Error error;
    v1::BackupServerMessage in;
    while (stream->Read(&in)) {
      if (in.has_error()) error = in.error();
    }
    EXPECT_TRUE(stream->Finish().ok());
    return error;
  }
};

TEST_F(FollowerAckTest, AWorkersAckIsRelayedWithItsSessionsNamespaceAndRank) {
  RelayingRole role;
  Start(&role);
  const std::string worker = OpenAs(v1::ROLE_WORKER, 0, "tenant");
  ASSERT_FALSE(worker.empty());
  EXPECT_EQ(LayerStored(worker, {5, 6}, 1, false).code(), 0);
  ASSERT_EQ(role.calls().size(), 1u);
  EXPECT_EQ(role.calls()[0].ns, "tenant");
  EXPECT_EQ(role.calls()[0].rank, 0u);
  EXPECT_EQ(role.calls()[0].step, 1u);
  EXPECT_EQ(role.calls()[0].ops, (std::vector<uint64_t>{5, 6}));
  // The leader's refusal is the worker's answer.
  role.set_answer(absl::InvalidArgumentError("not a backup of this namespace"));
  v1::BackupServerMessage::Error refused = LayerStored(worker, {7}, 0, false);
  EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(refused.message(), "not a backup of this namespace");
  // Fences on a follower: refused here, not relayed.
  v1::BackupServerMessage::Error fenced = LayerStored(worker, {7}, 0, true);
  EXPECT_EQ(fenced.code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(fenced.message().find("fences on a CP group follower"),
            std::string::npos)
      << fenced.message();
  EXPECT_EQ(role.calls().size(), 2u);
  // The follower's own engine was never asked.
  EXPECT_EQ(engine_->Stats().backups_committed, 0);
}

TEST_F(FollowerAckTest, ASchedulersAckIsNotRelayed) {
  RelayingRole role;
  Start(&role);
  // A follower redirects a scheduler's OpenSession; one opened behind the
  // service's back still gets no relay.
  auto info = sessions_->Open("test", SessionRole::kScheduler, 0, "tenant",
                              absl::Minutes(1));
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string scheduler = info->id;
  v1::BackupServerMessage::Error error = LayerStored(scheduler, {5}, 0, false);
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(error.message().find(kLeader), std::string::npos) << error.message();
  EXPECT_TRUE(role.calls().empty());
}

TEST_F(FollowerAckTest, OnTheLeaderAcksAreServedLocally) {
  RelayingRole role;
  role.set_leader(true);
  Start(&role);
  const std::string worker = OpenAs(v1::ROLE_WORKER, 0, "tenant");
  // Not a backup of the namespace: the local SessionManager's answer.
  EXPECT_EQ(LayerStored(worker, {5}, 0, false).code(),
            static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(role.calls().empty());
}

}  // namespace
}  // namespace hicache::service
