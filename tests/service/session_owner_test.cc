// Sessions are bound to the principal that opened them (issue 26): a
// session id is not a bearer token. Against a real DaemonServer on a unix
// socket, connections are made as other uids (the peer credentials the
// daemon reads from the socket); every call that names a session, made by
// another uid with a session it did not open, is answered NOT_FOUND, the
// answer for an unknown id, and changes nothing. The opener's other
// connections and operators may use it.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/cpp/endpoint.h"
#include "daemon/main/daemon_server.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/create_channel_posix.h"
#include "gtest/gtest.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tokens.h"

namespace hicache {
namespace {

using testing::Pack;
using testing::Seq;

constexpr uid_t kOwner = 65534;     // nobody: opens the session.
constexpr uid_t kStranger = 65533;  // Another plain client.

class SessionOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "connecting as other uids needs root";
    }
    DaemonConfig config;
    config.page_size = 4;
    config.device_pages_per_rank = 16;
    config.host_pages_per_rank = 32;
    socket_ = dir_.Child("hicached.sock");
    auto server = DaemonServer::Start(config, socket_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    // Reachable by the other uids (the packaged socket is group-only).
    ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
    ASSERT_EQ(chmod(socket_.c_str(), 0666), 0);
  }

  // A stub over a connection made with effective uid `uid` (the daemon
  // reads it with SO_PEERCRED). The raw syscall changes only the calling
  // thread's credentials, and that thread ends with them.
  std::unique_ptr<v1::HiCache::Stub> ConnectAs(uid_t uid) {
    int fd = -1;
    std::thread([&] {
      if (syscall(SYS_setresuid, -1, uid, -1) != 0) return;
      fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(fd);
        fd = -1;
      }
    }).join();
    EXPECT_GE(fd, 0) << "connect as uid " << uid << ": " << strerror(errno);
    if (fd < 0) return nullptr;
    return v1::HiCache::NewStub(grpc::CreateInsecureChannelFromFd("", fd));
  }
  std::unique_ptr<v1::HiCache::Stub> AsRoot() {
    return v1::HiCache::NewStub(grpc::CreateChannel(
        client::UnixTarget(socket_), grpc::InsecureChannelCredentials()));
  }

  static std::string Open(v1::HiCache::Stub& stub,
                          v1::Role role = v1::ROLE_SCHEDULER) {
    grpc::ClientContext ctx;
    v1::OpenSessionRequest request;
    request.set_client_name("owner-test");
    request.set_role(role);
    v1::OpenSessionResponse response;
    grpc::Status s = stub.OpenSession(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.session_id();
  }
  static grpc::Status KeepAlive(v1::HiCache::Stub& stub,
                                const std::string& session) {
    grpc::ClientContext ctx;
    v1::KeepAliveRequest request;
    request.set_session_id(session);
    v1::KeepAliveResponse response;
    return stub.KeepAlive(&ctx, request, &response);
  }
  static grpc::Status Allocate(v1::HiCache::Stub& stub,
                               const std::string& session,
                               std::vector<int64_t>* pages = nullptr) {
    grpc::ClientContext ctx;
    v1::AllocateRequest request;
    request.set_session_id(session);
    request.add_items()->set_num_pages(2);
    v1::AllocateResponse response;
    grpc::Status s = stub.Allocate(&ctx, request, &response);
    if (pages != nullptr && s.ok()) {
      for (const auto& a : response.allocations()) {
        pages->insert(pages->end(), a.pages().begin(), a.pages().end());
      }
    }
    return s;
  }

  // Every call of the API that names a session, made with `session`.
  using Call =
      std::function<grpc::Status(v1::HiCache::Stub&, const std::string&)>;
  // A unary call of `method` with `request`, its session_id set per call.
  template <typename Request, typename Response>
  static Call Unary(grpc::Status (v1::HiCache::Stub::*method)(
                        grpc::ClientContext*, const Request&, Response*),
                    Request request) {
    return [method, request](v1::HiCache::Stub& stub, const std::string& id) {
      Request named = request;
      named.set_session_id(id);
      grpc::ClientContext ctx;
      Response response;
      return (stub.*method)(&ctx, named, &response);
    };
  }
  std::vector<std::pair<std::string, Call>> SessionCalls(
      std::vector<int64_t> pages, int64_t node) {
    std::vector<std::pair<std::string, Call>> calls;
    calls.emplace_back("KeepAlive", [](auto& stub, const std::string& id) {
      return KeepAlive(stub, id);
    });
    calls.emplace_back("Allocate", [](auto& stub, const std::string& id) {
      return Allocate(stub, id);
    });
    v1::FreeRequest free;
    free.mutable_pages()->Add(pages.begin(), pages.end());
    calls.emplace_back("Free", Unary(&v1::HiCache::Stub::Free, free));
    v1::MatchPrefixRequest match;
    match.add_items()->set_tokens(Pack(Seq(100, 8)));
    calls.emplace_back("MatchPrefix",
                       Unary(&v1::HiCache::Stub::MatchPrefix, match));
    v1::InsertRequest insert;
    v1::InsertItem* inserted = insert.add_items();
    inserted->set_tokens(Pack(Seq(500, 8)));
    inserted->mutable_pages()->Add(pages.begin(), pages.end());
    calls.emplace_back("Insert", Unary(&v1::HiCache::Stub::Insert, insert));
    v1::LockRequest lock;
    lock.add_nodes(node);
    calls.emplace_back("Lock", Unary(&v1::HiCache::Stub::Lock, lock));
    calls.emplace_back("Unlock", Unary(&v1::HiCache::Stub::Unlock, lock));
    v1::AdmitRequest admit;
    admit.add_items()->set_tokens(Pack(Seq(900, 8)));
    calls.emplace_back("Admit", Unary(&v1::HiCache::Stub::Admit, admit));
    v1::CompleteRequest complete;
    v1::CompleteItem* completed = complete.add_items();
    completed->set_tokens(Pack(Seq(900, 8)));
    completed->add_pages(1);
    completed->add_pages(2);
    calls.emplace_back("Complete",
                       Unary(&v1::HiCache::Stub::Complete, complete));
    v1::FinishLoadRequest finish;
    finish.set_load_id(1);
    calls.emplace_back("FinishLoad",
                       Unary(&v1::HiCache::Stub::FinishLoad, finish));
    v1::PinRequest pin;
    pin.set_node(node);
    pin.set_ttl_ms(1000);
    calls.emplace_back("Pin", Unary(&v1::HiCache::Stub::Pin, pin));
    v1::QueryTiersRequest tiers;
    tiers.add_queries()->set_tokens(Pack(Seq(500, 8)));
    calls.emplace_back("QueryTiers",
                       Unary(&v1::HiCache::Stub::QueryTiers, tiers));
    v1::RegisterFenceRequest fence;
    fence.set_event_handle(std::string(64, '\0'));
    calls.emplace_back("RegisterFence",
                       Unary(&v1::HiCache::Stub::RegisterFence, fence));
    v1::ReleaseFenceRequest release;
    release.set_fence_id(1);
    calls.emplace_back("ReleaseFence",
                       Unary(&v1::HiCache::Stub::ReleaseFence, release));
    calls.emplace_back("LoadBack", [](auto& stub, const std::string& id) {
      grpc::ClientContext ctx;
      v1::LoadBackRequest r;
      r.set_session_id(id);
      r.set_tokens(Pack(Seq(500, 8)));
      auto reader = stub.LoadBack(&ctx, r);
      v1::LoadBackEvent event;
      while (reader->Read(&event)) {
      }
      return reader->Finish();
    });
    calls.emplace_back("Subscribe", [](auto& stub, const std::string& id) {
      grpc::ClientContext ctx;
      v1::SubscribeRequest r;
      r.set_session_id(id);
      auto reader = stub.Subscribe(&ctx, r);
      v1::WorkerEvent event;
      if (reader->Read(&event)) ctx.TryCancel();  // Subscribed: stop.
      while (reader->Read(&event)) {
      }
      return reader->Finish();
    });
    calls.emplace_back("BackupSession", [](auto& stub, const std::string& id) {
      grpc::ClientContext ctx;
      auto stream = stub.BackupSession(&ctx);
      v1::BackupClientMessage m;
      m.set_session_id(id);
      m.mutable_rollback()->set_backup_id(1);
      stream->Write(m);
      stream->WritesDone();
      v1::BackupServerMessage out;
      while (stream->Read(&out)) {
      }
      return stream->Finish();
    });
    calls.emplace_back("CloseSession", [](auto& stub, const std::string& id) {
      grpc::ClientContext ctx;
      v1::CloseSessionRequest r;
      r.set_session_id(id);
      v1::CloseSessionResponse response;
      return stub.CloseSession(&ctx, r, &response);
    });
    return calls;
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  hicache::testing::TempDir dir_;
  std::string socket_;
  std::unique_ptr<DaemonServer> server_;
};

TEST_F(SessionOwnerTest, AnotherUidCannotUseASessionItDidNotOpen) {
  auto owner = ConnectAs(kOwner);
  auto stranger = ConnectAs(kStranger);
  ASSERT_NE(owner, nullptr);
  ASSERT_NE(stranger, nullptr);
  const std::string session = Open(*owner);
  ASSERT_FALSE(session.empty());
  std::vector<int64_t> pages;
  ASSERT_TRUE(Allocate(*owner, session, &pages).ok());
  ASSERT_EQ(pages.size(), 2u);

  // The stranger's own session works (it is a plain client, not refused).
  const std::string own = Open(*stranger);
  EXPECT_TRUE(KeepAlive(*stranger, own).ok());

  // Every call naming the owner's session: NOT_FOUND, as for an unknown id.
  for (const auto& [name, call] : SessionCalls(pages, /*node=*/1)) {
    const grpc::Status s = call(*stranger, session);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND)
        << name << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("unknown or its lease expired"),
              std::string::npos)
        << name << ": " << s.error_message();
    // Changed nothing: the session is still open and its pages its own.
    ASSERT_TRUE(KeepAlive(*owner, session).ok()) << "after " << name;
  }
  // The owner's pages were not freed by the stranger's Free: freeing them
  // as the owner succeeds exactly once.
  {
    grpc::ClientContext ctx;
    v1::FreeRequest r;
    r.set_session_id(session);
    r.mutable_pages()->Add(pages.begin(), pages.end());
    v1::FreeResponse response;
    EXPECT_TRUE(owner->Free(&ctx, r, &response).ok());
  }
}

// The table above covers every RPC whose request names a session, so a new
// one cannot skip the check by being forgotten.
TEST_F(SessionOwnerTest, EveryRpcThatNamesASessionIsChecked) {
  std::set<std::string> checked;
  for (const auto& [name, call] : SessionCalls({}, 1)) checked.insert(name);
  std::set<std::string> naming;
  const google::protobuf::ServiceDescriptor* service =
      v1::KeepAliveRequest::descriptor()->file()->FindServiceByName("HiCache");
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor* method = service->method(i);
    if (method->input_type()->FindFieldByName("session_id") != nullptr) {
      naming.insert(method->name());
    }
  }
  EXPECT_EQ(checked, naming);
}

TEST_F(SessionOwnerTest, TheOpenersOtherConnectionsAndOperatorsMayUseIt) {
  auto owner = ConnectAs(kOwner);
  ASSERT_NE(owner, nullptr);
  const std::string session = Open(*owner);
  ASSERT_FALSE(session.empty());
  // A second connection of the same uid (a restarted client process).
  auto again = ConnectAs(kOwner);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(KeepAlive(*again, session).ok());
  EXPECT_TRUE(Allocate(*again, session).ok());
  // Root is an operator: it may act on any session (docs/security.md).
  auto root = AsRoot();
  EXPECT_TRUE(KeepAlive(*root, session).ok());
  // An unknown id reads the same to everyone.
  auto stranger = ConnectAs(kStranger);
  ASSERT_NE(stranger, nullptr);
  const grpc::Status unknown = KeepAlive(*stranger, "s99-nonexistent");
  const grpc::Status foreign = KeepAlive(*stranger, session);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace hicache
