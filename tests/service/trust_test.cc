// Issue 11 reproductions: what a buggy or hostile client could send through
// the public API, against a real DaemonServer on a unix socket. Each case
// failed on the code before the page ledger, the limits and the tenant
// checks; each must be refused with a clear error and change nothing.
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"
#include "daemon/main/daemon_server.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

using testing::Pack;
using testing::Seq;

class TrustTest : public ::testing::Test {
 protected:
  void StartServer(uint32_t cp_size = 1,
                   std::function<void(DaemonConfig*)> tweak = nullptr) {
    DaemonConfig config;
    config.page_size = 4;
    config.cp_size = cp_size;
    config.device_pages_per_rank = 16;
    config.host_pages_per_rank = 32;
    config.kv_preset = "tiny";
    config.default_lease_ms = 5000;
    // Written against write_through_selective (an unbacked eviction
    // removes the node); the default is write_ahead.
    config.write_policy = WritePolicy::kWriteThroughSelective;
    if (tweak != nullptr) tweak(&config);
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
  }
  void SetUp() override { StartServer(); }

  std::string Open(const std::string& ns = "",
                   v1::Role role = v1::ROLE_SCHEDULER) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("test");
    request.set_role(role);
    request.set_namespace_(ns);
    v1::OpenSessionResponse response;
    grpc::Status s = stub_->OpenSession(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.session_id();
  }

  grpc::Status Allocate(const std::string& session,
                        const std::vector<v1::AllocateItem>& items,
                        std::vector<int64_t>* pages = nullptr) {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session);
    for (const auto& item : items) *request.add_items() = item;
    v1::AllocateResponse response;
    grpc::Status s = stub_->Allocate(&ctx, request, &response);
    if (pages != nullptr) {
      pages->clear();
      for (const auto& a : response.allocations()) {
        pages->insert(pages->end(), a.pages().begin(), a.pages().end());
      }
    }
    return s;
  }
  std::vector<int64_t> AllocateN(const std::string& session, int n) {
    v1::AllocateItem item;
    item.set_num_pages(n);
    std::vector<int64_t> pages;
    EXPECT_TRUE(Allocate(session, {item}, &pages).ok());
    return pages;
  }

  grpc::Status Free(const std::string& session,
                    const std::vector<int64_t>& pages) {
    grpc::ClientContext ctx;
    v1::FreeRequest request;
    request.set_session_id(session);
    request.mutable_pages()->Add(pages.begin(), pages.end());
    v1::FreeResponse response;
    return stub_->Free(&ctx, request, &response);
  }

  grpc::Status Insert(const std::string& session,
                      const std::vector<int32_t>& tokens,
                      const std::vector<int64_t>& pages,
                      v1::InsertResponse* response = nullptr) {
    grpc::ClientContext ctx;
    v1::InsertRequest request;
    request.set_session_id(session);
    v1::InsertItem* item = request.add_items();
    item->set_tokens(Pack(tokens));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    v1::InsertResponse local;
    return stub_->Insert(&ctx, request, response ? response : &local);
  }

  grpc::Status Close(const std::string& session,
                     v1::CloseSessionResponse* response = nullptr) {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest request;
    request.set_session_id(session);
    v1::CloseSessionResponse local;
    return stub_->CloseSession(&ctx, request, response ? response : &local);
  }

  v1::MatchResult Match(const std::string& session,
                        const std::vector<int32_t>& tokens) {
    grpc::ClientContext ctx;
    v1::MatchPrefixRequest request;
    request.set_session_id(session);
    request.add_items()->set_tokens(Pack(tokens));
    v1::MatchPrefixResponse response;
    EXPECT_TRUE(stub_->MatchPrefix(&ctx, request, &response).ok());
    return response.results(0);
  }

  // Every allocated device page has one holder; after every session closed,
  // only the tree holds pages.
  void ExpectConsistent() {
    server_->engine().WaitForTransfers();
    EXPECT_TRUE(server_->engine().CheckInvariants().ok())
        << server_->engine().CheckInvariants();
  }
  void ExpectOnlyTreePages() {
    ExpectConsistent();
    EXPECT_EQ(server_->engine().DeviceAllocatedPages(),
              server_->engine().TreeDevicePages());
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("d.sock");
  FakeClock clock_{absl::FromUnixSeconds(100)};
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<v1::HiCache::Stub> stub_;
};

// Reproduction 1: C inserts B's page as a "duplicate" of A's node; the daemon
// freed it, and two sessions ended up holding one page.
TEST_F(TrustTest, InsertOfAnotherSessionsPageIsRefusedAndChangesNothing) {
  const std::string a = Open(), b = Open(), c = Open();
  const std::vector<int32_t> tokens = Seq(1, 4);
  const std::vector<int64_t> a_pages = AllocateN(a, 1);
  ASSERT_TRUE(Insert(a, tokens, a_pages).ok());
  const std::vector<int64_t> b_pages = AllocateN(b, 1);

  const grpc::Status stolen = Insert(c, tokens, b_pages);
  EXPECT_EQ(stolen.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(stolen.error_message(), HasSubstr("not held by this session"));
  ExpectConsistent();
  // B still holds its page: nobody else can allocate it, B can free it once.
  std::vector<int64_t> everything_else;
  v1::AllocateItem rest;
  rest.set_num_pages(server_->engine().DeviceAvailable(0));
  ASSERT_TRUE(Allocate(c, {rest}, &everything_else).ok());
  EXPECT_THAT(everything_else, ::testing::Not(::testing::Contains(b_pages[0])));
  EXPECT_TRUE(Free(b, b_pages).ok());
  EXPECT_EQ(Free(b, b_pages).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (const std::string& s : {a, b, c}) EXPECT_TRUE(Close(s).ok());
  ExpectOnlyTreePages();
}

// Reproduction 1, variant: inserting 2 of another session's 4 pages made
// that session's all-or-nothing close fail and leak the other 2.
TEST_F(TrustTest, PartialTheftCannotBreakTheOwnersClose) {
  const std::string owner = Open(), thief = Open();
  const std::vector<int64_t> pages = AllocateN(owner, 4);
  EXPECT_EQ(Insert(thief, Seq(1, 8), {pages[0], pages[1]}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::CloseSessionResponse closed;
  ASSERT_TRUE(Close(owner, &closed).ok());
  EXPECT_EQ(closed.freed_pages(), 4);
  ASSERT_TRUE(Close(thief).ok());
  ExpectOnlyTreePages();
  EXPECT_EQ(server_->engine().DeviceAllocatedPages(), 0);
}

// Reproduction 2: Free([p, p]) leaked p; Insert(pages=[p, p]) built a node
// holding p twice.
TEST_F(TrustTest, RepeatedPageIdsAreRefused) {
  const std::string s = Open();
  const std::vector<int64_t> pages = AllocateN(s, 2);
  const grpc::Status twice = Free(s, {pages[0], pages[0]});
  EXPECT_EQ(twice.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(twice.error_message(), HasSubstr("repeats"));
  EXPECT_EQ(Insert(s, Seq(1, 8), {pages[0], pages[0]}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ExpectConsistent();
  EXPECT_EQ(server_->engine().TreeDevicePages(), 0);
  EXPECT_TRUE(Free(s, pages).ok());  // Both still the session's.
  ASSERT_TRUE(Close(s).ok());
  EXPECT_EQ(server_->engine().DeviceAllocatedPages(), 0);
}

// Reproduction 3: a 2^62-page zigzag item threw (UNKNOWN) and leaked the
// earlier item's pages; 2^29 round-robin pages took seconds and gigabytes.
TEST_F(TrustTest, HugeAllocationsAreRefusedBeforeAnyWork) {
  const std::string s = Open();
  v1::AllocateItem ten, huge, big;
  ten.set_num_pages(10);
  huge.set_num_pages(int64_t{1} << 62);
  huge.set_mode(v1::COMPUTE_OWNER_MODE_ZIGZAG);
  big.set_num_pages(int64_t{1} << 29);
  big.set_mode(v1::COMPUTE_OWNER_MODE_ROUND_ROBIN);
  const grpc::Status first = Allocate(s, {ten, huge});
  EXPECT_EQ(first.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(first.error_message(), HasSubstr("usable device pages"));
  EXPECT_EQ(Allocate(s, {big}).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  v1::AllocateItem negative;
  negative.set_num_pages(-1);
  EXPECT_EQ(Allocate(s, {negative}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ExpectConsistent();
  EXPECT_EQ(server_->engine().DeviceAllocatedPages(), 0);
  EXPECT_EQ(server_->sessions().totals().pages, 0);
}

// Reproduction 4: after prepare the client half-closed, and the stream
// never ended; its backups stayed until the session died.
TEST_F(TrustTest, HalfClosedBackupStreamRollsBackAndEnds) {
  const std::string s = Open();
  const std::vector<int64_t> pages = AllocateN(s, 2);
  grpc::ClientContext ctx;
  auto stream = stub_->BackupSession(&ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id(s);
  v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
  spec->mutable_pages()->Add(pages.begin(), pages.end());
  spec->set_logical_tokens(8);
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.has_prepared());
  const uint64_t id = reply.prepared().backup_ids(0);
  ASSERT_NE(id, 0u);
  ASSERT_TRUE(stream->WritesDone());
  bool rolled_back = false;
  while (stream->Read(&reply)) {
    if (reply.has_rolled_back() && reply.rolled_back().backup_id() == id) {
      rolled_back = true;
    }
  }
  EXPECT_TRUE(rolled_back);
  EXPECT_TRUE(stream->Finish().ok());
  ExpectConsistent();
  // The backup is gone; the pages are still the session's to use or free.
  EXPECT_EQ(server_->engine().Stats().backups_rolled_back, 1);
  EXPECT_TRUE(Free(s, pages).ok());
}

// Reproduction 5: SetFreeRoom(l1 = INT64_MAX) overflowed and silently
// stopped eviction.
TEST_F(TrustTest, FreeRoomTargetsAreBounded) {
  grpc::ClientContext ctx;
  v1::SetFreeRoomRequest request;
  request.set_l1_pages_per_lane(INT64_MAX);
  v1::SetFreeRoomResponse response;
  const grpc::Status s = stub_->SetFreeRoom(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("free-room targets must be in"));
  // Eviction still works: an allocation larger than what is free succeeds
  // by evicting cached pages.
  const std::string session = Open();
  ASSERT_TRUE(Insert(session, Seq(1, 40), AllocateN(session, 10)).ok());
  EXPECT_EQ(AllocateN(session, 12).size(), 12u);
}

// Reproduction 6: tenant B locked and pinned tenant A's node for 49 days;
// unknown enum values were accepted.
TEST_F(TrustTest, SessionsAreConfinedToTheirNamespace) {
  const std::string a = Open("tenant-a"), b = Open("tenant-b");
  const std::vector<int32_t> tokens = Seq(1, 8);
  v1::InsertResponse inserted;
  ASSERT_TRUE(Insert(a, tokens, AllocateN(a, 2), &inserted).ok());
  const uint64_t node = inserted.results(0).node();
  {
    grpc::ClientContext ctx;
    v1::LockRequest request;
    request.set_session_id(b);
    request.add_nodes(node);
    v1::LockResponse response;
    const grpc::Status s = stub_->Lock(&ctx, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::PinRequest request;
    request.set_session_id(b);
    request.set_node(node);
    request.set_ttl_ms(1000);
    v1::PinResponse response;
    EXPECT_EQ(stub_->Pin(&ctx, request, &response).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::PinRequest request;
    request.set_session_id(a);
    request.set_node(node);
    request.set_ttl_ms(UINT32_MAX);  // Over --max_pin_ttl_ms.
    v1::PinResponse response;
    EXPECT_EQ(stub_->Pin(&ctx, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(server_->engine().Inspect(node)->lock_ref, 0);
  EXPECT_EQ(server_->engine().Inspect(node)->pin_remaining_ms, 0);
  EXPECT_EQ(Match(b, tokens).device().valid_tokens(), 0);
  // Unknown enum values.
  {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("x");
    request.set_role(static_cast<v1::Role>(99));
    v1::OpenSessionResponse response;
    EXPECT_EQ(stub_->OpenSession(&ctx, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  v1::AllocateItem odd;
  odd.set_num_pages(1);
  odd.set_mode(static_cast<v1::ComputeOwnerMode>(77));
  EXPECT_EQ(Allocate(a, {odd}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::AllocateItem both;
  both.add_owners(0);
  both.set_mode(v1::COMPUTE_OWNER_MODE_ZIGZAG);
  EXPECT_EQ(Allocate(a, {both}).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// QueryTiers (routers): confined to a session's namespace, operators only
// without one, a pure lookup, and bounded.
TEST_F(TrustTest, QueryTiersIsConfinedPureAndBounded) {
  const std::string a = Open("tenant-a"), b = Open("tenant-b");
  const std::vector<int32_t> tokens = Seq(1, 8);
  v1::InsertResponse inserted;
  ASSERT_TRUE(Insert(a, tokens, AllocateN(a, 2), &inserted).ok());
  const uint64_t node = inserted.results(0).node();
  auto query = [&](const std::string& session, const std::string& ns,
                   std::string bytes, v1::QueryTiersResponse* out) {
    grpc::ClientContext ctx;
    v1::QueryTiersRequest request;
    request.set_session_id(session);
    v1::TierQuery* q = request.add_queries();
    q->set_namespace_(ns);
    q->set_tokens(std::move(bytes));
    return stub_->QueryTiers(&ctx, request, out);
  };
  v1::QueryTiersResponse r;
  ASSERT_TRUE(query(a, "", Pack(tokens), &r).ok());
  EXPECT_EQ(r.hits(0).device_tokens(), 8);
  r.Clear();
  ASSERT_TRUE(query(b, "", Pack(tokens), &r).ok());
  EXPECT_EQ(r.hits(0).device_tokens(), 0);  // Its own namespace: a miss.
  EXPECT_EQ(query(b, "tenant-a", Pack(tokens), &r).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  const std::string worker = Open("tenant-a", v1::ROLE_WORKER);
  EXPECT_EQ(query(worker, "", Pack(tokens), &r).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(query("s9-nope", "", Pack(tokens), &r).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(query(a, "", "abc", &r).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Without a session: an operator (the test runs as root), any namespace.
  r.Clear();
  ASSERT_TRUE(query("", "tenant-a", Pack(tokens), &r).ok());
  EXPECT_EQ(r.hits(0).device_tokens(), 8);
  {
    grpc::ClientContext ctx;
    v1::QueryTiersRequest request;
    for (int i = 0; i <= 65536; ++i) request.add_queries();
    v1::QueryTiersResponse response;
    EXPECT_EQ(stub_->QueryTiers(&ctx, request, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Nothing was counted or touched.
  EXPECT_EQ(server_->engine().Inspect(node)->hit_count, 0u);
  EXPECT_EQ(server_->engine().Inspect(node)->lock_ref, 0);
  EXPECT_TRUE(Close(worker).ok());
  ExpectConsistent();
}

// OpenSession's event identity: for schedulers, validated even with events
// off; a topic another namespace took is refused and leaves no session.
TEST_F(TrustTest, EventIdentityIsValidatedAndTopicsAreNotShared) {
  auto open = [&](const std::string& ns, v1::Role role,
                  const std::string& instance, const std::string& model) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("test");
    request.set_role(role);
    request.set_namespace_(ns);
    request.set_event_instance(instance);
    request.set_event_model(model);
    v1::OpenSessionResponse response;
    return stub_->OpenSession(&ctx, request, &response);
  };
  EXPECT_EQ(open("", v1::ROLE_WORKER, "pod", "").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(open("", v1::ROLE_SCHEDULER, "pod@1", "").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(open("", v1::ROLE_SCHEDULER, "", std::string(300, 'm')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(open("", v1::ROLE_SCHEDULER, "pod", "m").ok());  // Events off.

  server_.reset();
  const std::string endpoint = "ipc://" + dir_.Child("events");
  StartServer(1, [&endpoint](DaemonConfig* c) {
    c->kv_events.endpoint = endpoint;
    c->kv_events.instance = "node";
  });
  EXPECT_TRUE(open("tenant-a", v1::ROLE_SCHEDULER, "pod", "m").ok());
  const size_t sessions = server_->sessions().List().size();
  const grpc::Status taken = open("tenant-b", v1::ROLE_SCHEDULER, "pod", "m");
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(taken.error_message(), HasSubstr("tenant-a"));
  EXPECT_EQ(server_->sessions().List().size(), sessions);
  EXPECT_TRUE(open("tenant-b", v1::ROLE_SCHEDULER, "pod", "m2").ok());
}

TEST_F(TrustTest, WorkerSessionsCannotActAsSchedulers) {
  const std::string worker = Open("", v1::ROLE_WORKER);
  v1::AllocateItem item;
  item.set_num_pages(1);
  const grpc::Status s = Allocate(worker, {item});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("needs a scheduler session"));
  EXPECT_EQ(Insert(worker, Seq(1, 4), {}).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Close(worker).ok());
}

// Reproduction 7: namespace roots were never freed, so names grew the
// daemon for good.
TEST_F(TrustTest, EmptyNamespacesAreFreedAndNamesAreBounded) {
  for (int round = 0; round < 3; ++round) {
    const std::string s = Open("tenant-" + std::to_string(round));
    ASSERT_TRUE(Insert(s, Seq(1, 4), AllocateN(s, 1)).ok());
    grpc::ClientContext ctx;
    v1::EvictRequest evict;
    evict.add_device_pages_per_lane(1000);
    v1::EvictResponse evicted;
    ASSERT_TRUE(stub_->Evict(&ctx, evict, &evicted).ok());
    ASSERT_TRUE(Close(s).ok());
  }
  EXPECT_EQ(server_->engine().TreeStatistics().namespaces, 0);
  grpc::ClientContext ctx;
  v1::OpenSessionRequest request;
  request.set_client_name("big");
  request.set_role(v1::ROLE_SCHEDULER);
  request.set_namespace_(std::string(3 << 20, 'n'));
  v1::OpenSessionResponse response;
  const grpc::Status s = stub_->OpenSession(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("namespace has"));
}

// Found by the fuzzer: an empty token list handed memcpy a null source
// (UBSan nonnull-attribute). It is a valid request: a miss.
TEST_F(TrustTest, EmptyTokenListIsAMiss) {
  const std::string s = Open();
  EXPECT_EQ(Match(s, {}).device().valid_tokens(), 0);
}

double CpuSeconds() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return absl::ToDoubleSeconds(absl::DurationFromTimeval(usage.ru_utime) +
                               absl::DurationFromTimeval(usage.ru_stime));
}

// Reproduction 8: every BackupSession polled every 1 ms (100 idle streams:
// 116% CPU), and nothing capped their number.
TEST_F(TrustTest, IdleStreamsCostNoCpuAndAreCapped) {
  server_.reset();
  StartServer(1, [](DaemonConfig* c) { c->max_streams_per_session = 40; });
  const std::string s = Open();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<
      grpc::ClientReaderWriter<v1::BackupClientMessage, v1::BackupServerMessage>>>
      streams;
  const std::vector<int64_t> pages = AllocateN(s, 1);
  for (int i = 0; i < 40; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub_->BackupSession(contexts.back().get()));
    v1::BackupClientMessage hello;
    hello.set_session_id(s);
    hello.mutable_rollback()->set_backup_id(1000 + i);  // An error reply.
    ASSERT_TRUE(streams.back()->Write(hello));
    v1::BackupServerMessage reply;
    ASSERT_TRUE(streams.back()->Read(&reply));
    EXPECT_TRUE(reply.has_error());
  }
  // One more is over the cap.
  {
    grpc::ClientContext ctx;
    auto extra = stub_->BackupSession(&ctx);
    v1::BackupClientMessage hello;
    hello.set_session_id(s);
    hello.mutable_rollback()->set_backup_id(1);
    extra->Write(hello);
    extra->WritesDone();
    v1::BackupServerMessage reply;
    while (extra->Read(&reply)) {
    }
    EXPECT_EQ(extra->Finish().error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  const double before = CpuSeconds();
  absl::SleepFor(absl::Seconds(1));
  const double used = CpuSeconds() - before;
  std::fprintf(stderr, "40 idle backup streams: %.4f s of CPU in 1 s\n", used);
  // Polling streams burned ~0.5 s of CPU per second here; waiting ones ~0.
  EXPECT_LT(used, 0.1) << "40 idle streams used " << used << " s of CPU in 1 s";
  for (auto& stream : streams) {
    stream->WritesDone();
    v1::BackupServerMessage reply;
    while (stream->Read(&reply)) {
    }
    EXPECT_TRUE(stream->Finish().ok());
  }
}

// A client that never reads is cut off once its backlog is full, and its
// backups are rolled back.
TEST_F(TrustTest, SlowStreamReaderIsCutOffAndRolledBack) {
  server_.reset();
  // 1024 one-page backups on 64 ranks: 131072 per-layer events (~1.7 MB),
  // far more than gRPC buffers for a client that does not read.
  StartServer(64, [](DaemonConfig* c) {
    c->device_pages_per_rank = 20;
    c->host_pages_per_rank = 20;
    c->max_stream_backlog = 64;
  });
  const std::string s = Open();
  const std::vector<int64_t> pages = AllocateN(s, 1024);
  // A small receive window, so that the daemon's writes stall quickly.
  grpc::ChannelArguments args;
  args.SetInt("grpc.http2.lookahead_bytes", 1024);
  args.SetInt("grpc.http2.bdp_probe", 0);
  auto slow = v1::HiCache::NewStub(grpc::CreateCustomChannel(
      client::UnixTarget(socket_), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  auto stream = slow->BackupSession(&ctx);
  v1::BackupClientMessage prepare;
  prepare.set_session_id(s);
  for (int64_t page : pages) {
    v1::BackupSpec* spec = prepare.mutable_prepare()->add_specs();
    spec->add_pages(page);
    spec->set_logical_tokens(4);
  }
  ASSERT_TRUE(stream->Write(prepare));
  v1::BackupServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_EQ(reply.prepared().backup_ids_size(), 1024);
  for (uint32_t step = 0; step < 2; ++step) {
    v1::BackupClientMessage stored;
    stored.set_session_id(s);
    stored.mutable_layer_stored()->mutable_backup_ids()->Add(
        reply.prepared().backup_ids().begin(),
        reply.prepared().backup_ids().end());
    stored.mutable_layer_stored()->set_step(step);
    stream->Write(stored);
  }
  // The client reads none of the events. The daemon's writes stall, its
  // backlog overflows, and it cuts the stream off and rolls the stream's
  // backups back, with no help from the client.
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (server_->engine().Stats().backups_rolled_back < 1024 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server_->engine().Stats().backups_rolled_back, 1024);
  ctx.TryCancel();
  EXPECT_FALSE(stream->Finish().ok());
  EXPECT_EQ(server_->engine().Stats().backups_committed, 0);
  ExpectConsistent();
  EXPECT_TRUE(Close(s).ok());
  ExpectOnlyTreePages();
}

}  // namespace
}  // namespace hicache
