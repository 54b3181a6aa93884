#include "daemon/main/grpc_rendezvous_store.h"

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/comm/communicator.h"
#include "daemon/comm/gloo_communicator.h"
#include "daemon/group/join_handler.h"
#include "daemon/group/rendezvous_kv.h"
#include "daemon/service/cp_group_service.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/prefix_store.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

namespace pb = ::hicache::internal::v1;

// The first frame a link delivers, and its failure (std::promise only:
// Debian's Abseil is not TSan-instrumented).
class FirstFrame {
 public:
  absl::Status StartOn(comm::Communicator& link) {
    return link.Start(
        [this](absl::string_view frame) {
          if (!got_) {
            got_ = true;
            frame_.set_value(std::string(frame));
          }
        },
        [](const absl::Status&) {});
  }
  // The frame, or "" if none came within 30 s.
  std::string Wait() {
    auto f = frame_.get_future();
    if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
      return "";
    }
    return f.get();
  }

 private:
  bool got_ = false;  // Only the one delivery thread touches it.
  std::promise<std::string> frame_;
};

class RefusingJoinHandler final : public group::JoinHandler {
 public:
  absl::StatusOr<group::JoinReply> Join(const std::string&,
                                        const group::GroupGeometry&) override {
    return absl::UnavailableError("not in this test");
  }
};

// A real gRPC server on 127.0.0.1 (OS-chosen port) hosting CpGroupService
// over an InMemoryRendezvousKv, as a leader would.
class Leader {
 public:
  explicit Leader(group::RendezvousKvLimits limits = {})
      : kv_(limits), service_("g", &handler_, &kv_) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~Leader() { Stop(); }

  void Stop() {
    if (server_ == nullptr) return;
    kv_.Shutdown();  // Wake waiting Gets, so Shutdown does not wait on them.
    server_->Shutdown();
    server_.reset();
  }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  group::InMemoryRendezvousKv& kv() { return kv_; }

  std::unique_ptr<GrpcRendezvousStore> Store(
      GrpcRendezvousStoreOptions options = {}) const {
    return std::make_unique<GrpcRendezvousStore>(
        pb::CpGroup::NewStub(
            grpc::CreateChannel(target(), grpc::InsecureChannelCredentials())),
        options);
  }

 private:
  RefusingJoinHandler handler_;
  group::InMemoryRendezvousKv kv_;
  service::CpGroupService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(GrpcRendezvousStoreTest, SetGetWaitRoundTrip) {
  Leader leader;
  ASSERT_TRUE(leader.ok());
  auto a = leader.Store();
  auto b = leader.Store();
  a->set("k", std::vector<char>{'x', '\0', 'y'});
  EXPECT_EQ(b->get("k"), (std::vector<char>{'x', '\0', 'y'}));
  EXPECT_NO_THROW(b->wait({"k"}, std::chrono::milliseconds(10)));
  // Same value again is fine (Gloo may retry); another value is refused.
  EXPECT_NO_THROW(a->set("k", std::vector<char>{'x', '\0', 'y'}));
  EXPECT_THROW(b->set("k", std::vector<char>{'z'}), gloo::IoException);
}

TEST(GrpcRendezvousStoreTest, WaitSeesALaterSetWithoutPolling) {
  Leader leader;
  ASSERT_TRUE(leader.ok());
  auto a = leader.Store();
  auto b = leader.Store();
  auto waiter = std::async(std::launch::async, [&b] {
    b->wait({"k1", "k2"}, std::chrono::seconds(60));
    return b->get("k2");
  });
  a->set("k1", {'1'});
  a->set("k2", {'2'});
  EXPECT_EQ(waiter.get(), std::vector<char>{'2'});
}

TEST(GrpcRendezvousStoreTest, WaitTimeoutThrowsLikeFileStore) {
  Leader leader;
  ASSERT_TRUE(leader.ok());
  GrpcRendezvousStoreOptions options;
  options.timeout = absl::Milliseconds(50);
  auto store = leader.Store(options);
  try {
    store->wait({"missing"}, std::chrono::milliseconds(50));
    FAIL() << "wait returned";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("Wait timeout for key(s): missing"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(store->get("missing"), gloo::IoException);
}

TEST(GrpcRendezvousStoreTest, ServerCapIsFollowedByAnotherWait) {
  group::RendezvousKvLimits limits;
  limits.max_wait = absl::Milliseconds(20);  // Each Get is cut to 20 ms.
  Leader leader(limits);
  ASSERT_TRUE(leader.ok());
  auto store = leader.Store();
  const absl::Time start = absl::Now();
  auto missing = store->Get("missing", absl::Milliseconds(100));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
}

TEST(GrpcRendezvousStoreTest, RefusedSetAndDeadLeaderThrow) {
  group::RendezvousKvLimits limits;
  limits.max_value_bytes = 8;
  Leader leader(limits);
  ASSERT_TRUE(leader.ok());
  GrpcRendezvousStoreOptions options;
  options.timeout = absl::Milliseconds(200);
  options.rpc_timeout = absl::Milliseconds(500);
  auto store = leader.Store(options);
  EXPECT_THROW(store->set("big", std::vector<char>(9, 'v')), gloo::IoException);
  EXPECT_EQ(leader.kv().num_keys(), 0u);
  leader.Stop();
  EXPECT_THROW(store->set("k", {'v'}), gloo::IoException);
  EXPECT_THROW(store->get("k"), gloo::IoException);
  EXPECT_THROW(store->wait({"k"}), gloo::IoException);
}

// Two Gloo link ends rendezvous through the leader's RPCs only (no shared
// filesystem), each with its own store, and frames go both ways.
TEST(GrpcRendezvousStoreTest, GlooLinkConnectsThroughTheRpcs) {
  Leader leader;
  ASSERT_TRUE(leader.ok());
  std::unique_ptr<GrpcRendezvousStore> stores[2] = {leader.Store(),
                                                    leader.Store()};
  comm::GlooLinkOptions options[2];
  for (int rank = 0; rank < 2; ++rank) {
    auto device = comm::GlooCommunicator::CreateTcpDevice("127.0.0.1");
    ASSERT_TRUE(device.ok()) << device.status();
    options[rank].store = stores[rank].get();
    options[rank].key_prefix = "cp/g/1/b/";
    options[rank].rank = rank;
    options[rank].device = *device;
    options[rank].connect_timeout = absl::Seconds(30);
    options[rank].receive_timeout = absl::Seconds(30);
    options[rank].peer_name = rank == 0 ? "follower" : "leader";
  }
  auto follower = std::async(std::launch::async, [&options] {
    return comm::GlooCommunicator::Connect(options[1]);
  });
  auto leader_end = comm::GlooCommunicator::Connect(options[0]);
  auto follower_end = follower.get();
  ASSERT_TRUE(leader_end.ok()) << leader_end.status();
  ASSERT_TRUE(follower_end.ok()) << follower_end.status();
  EXPECT_GT(leader.kv().num_keys(), 0u);  // The addresses went through it.

  FirstFrame at_leader;
  FirstFrame at_follower;
  ASSERT_TRUE(at_leader.StartOn(**leader_end).ok());
  ASSERT_TRUE(at_follower.StartOn(**follower_end).ok());
  ASSERT_TRUE((*leader_end)->Send("to follower").ok());
  ASSERT_TRUE((*follower_end)->Send("to leader").ok());
  EXPECT_EQ(at_follower.Wait(), "to follower");
  EXPECT_EQ(at_leader.Wait(), "to leader");

  // The link's keys can be reclaimed once it is up.
  EXPECT_GT(leader.kv().EraseUnderPrefix("cp/g/1/b/"), 0u);
  EXPECT_EQ(leader.kv().num_keys(), 0u);
  (*leader_end)->Abort(absl::CancelledError("test over"));
  (*follower_end)->Abort(absl::CancelledError("test over"));
}

}  // namespace
}  // namespace hicache
