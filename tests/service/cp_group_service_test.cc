#include "daemon/service/cp_group_service.h"

#include <future>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/join_handler.h"
#include "daemon/group/rendezvous_kv.h"
#include "gtest/gtest.h"

namespace hicache::service {
namespace {

namespace pb = ::hicache::internal::v1;

group::GroupGeometry Geometry() {
  group::GroupGeometry g;
  g.page_size = 64;
  g.cp_size = 4;
  g.kv_preset = "tiny";
  g.kv_fingerprint = 0x1234;
  g.bytes_per_page = 2048;
  g.num_steps = 2;
  g.host_layout = "layer_first";
  g.device_pages_per_rank = 16;
  g.host_pages_per_rank = 64;
  g.wire_version = 1;
  g.max_frame_bytes = 1 << 20;
  g.build = "test";
  g.ranks = {2, 3};
  return g;
}

// Records what it was asked; answers `result`.
class FakeJoinHandler final : public group::JoinHandler {
 public:
  absl::StatusOr<group::JoinReply> Join(
      const std::string& member_name,
      const group::GroupGeometry& geometry) override {
    ++calls;
    last_member = member_name;
    last_geometry = geometry;
    return result;
  }

  int calls = 0;
  std::string last_member;
  group::GroupGeometry last_geometry;
  absl::StatusOr<group::JoinReply> result =
      group::JoinReply{1, 7, "cp/g/7/b/", "leader-a"};
};

class CpGroupServiceTest : public ::testing::Test {
 protected:
  CpGroupServiceTest() : kv_(Limits()), service_("g", &handler_, &kv_) {}

  static group::RendezvousKvLimits Limits() {
    group::RendezvousKvLimits l;
    l.max_key_bytes = 64;
    l.max_value_bytes = 128;
    l.max_keys = 2;
    return l;
  }

  pb::JoinRequest Request() {
    pb::JoinRequest r;
    r.set_group("g");
    r.set_member_name("b");
    r.set_geometry(group::EncodeGroupGeometry(Geometry()));
    r.set_advertise_address("10.0.0.2:50051");
    return r;
  }

  grpc::Status Join(const pb::JoinRequest& r, pb::JoinResponse* out) {
    grpc::ServerContext context;
    return service_.Join(&context, &r, out);
  }

  grpc::Status Set(const std::string& key, const std::string& value) {
    grpc::ServerContext context;
    pb::RendezvousSetRequest r;
    r.set_key(key);
    r.set_value(value);
    pb::RendezvousSetResponse out;
    return service_.RendezvousSet(&context, &r, &out);
  }

  grpc::Status Get(const std::string& key, uint32_t wait_ms,
                   std::string* value) {
    grpc::ServerContext context;
    pb::RendezvousGetRequest r;
    r.set_key(key);
    r.set_wait_ms(wait_ms);
    pb::RendezvousGetResponse out;
    grpc::Status s = service_.RendezvousGet(&context, &r, &out);
    *value = out.value();
    return s;
  }

  FakeJoinHandler handler_;
  group::InMemoryRendezvousKv kv_;
  CpGroupService service_;
};

TEST_F(CpGroupServiceTest, GoodJoin) {
  pb::JoinResponse out;
  grpc::Status s = Join(Request(), &out);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(handler_.calls, 1);
  EXPECT_EQ(handler_.last_member, "b");
  EXPECT_EQ(handler_.last_geometry, Geometry());
  EXPECT_EQ(out.member_index(), 1u);
  EXPECT_EQ(out.epoch(), 7u);
  EXPECT_EQ(out.rendezvous_prefix(), "cp/g/7/b/");
  EXPECT_EQ(out.leader_name(), "leader-a");
}

TEST_F(CpGroupServiceTest, GarbageGeometryIsInvalidArgument) {
  for (std::string bytes :
       {std::string(), std::string("\xff garbage"),
        group::EncodeGroupGeometry(Geometry()) + "x",
        group::EncodeGroupGeometry(Geometry()).substr(0, 10)}) {
    pb::JoinRequest r = Request();
    r.set_geometry(bytes);
    pb::JoinResponse out;
    EXPECT_EQ(Join(r, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  pb::JoinRequest r = Request();
  r.set_geometry(std::string(CpGroupService::kMaxGeometryBytes + 1, '\0'));
  pb::JoinResponse out;
  EXPECT_EQ(Join(r, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(handler_.calls, 0);
}

TEST_F(CpGroupServiceTest, WrongGroupIsFailedPrecondition) {
  pb::JoinRequest r = Request();
  r.set_group("other");
  pb::JoinResponse out;
  grpc::Status s = Join(r, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("\"other\""), std::string::npos);
  EXPECT_EQ(handler_.calls, 0);
}

TEST_F(CpGroupServiceTest, BadNamesAreInvalidArgument) {
  pb::JoinResponse out;
  pb::JoinRequest r = Request();
  r.set_member_name("");
  EXPECT_EQ(Join(r, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request();
  r.set_member_name(std::string(CpGroupService::kMaxNameBytes + 1, 'm'));
  EXPECT_EQ(Join(r, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request();
  r.set_advertise_address(std::string(CpGroupService::kMaxNameBytes + 1, 'a'));
  EXPECT_EQ(Join(r, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(handler_.calls, 0);
}

TEST_F(CpGroupServiceTest, HandlerRefusalsAreMapped) {
  const std::pair<absl::Status, grpc::StatusCode> cases[] = {
      {absl::FailedPreconditionError("page_size: leader 64, follower b 32"),
       grpc::StatusCode::FAILED_PRECONDITION},
      {absl::UnavailableError("retry"), grpc::StatusCode::UNAVAILABLE},
      {absl::InvalidArgumentError("x"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::AlreadyExistsError("x"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::ResourceExhaustedError("x"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::InternalError("x"), grpc::StatusCode::INTERNAL},
      {absl::NotFoundError("x"), grpc::StatusCode::INTERNAL},
      {absl::DataLossError("x"), grpc::StatusCode::INTERNAL},
  };
  for (const auto& [status, code] : cases) {
    handler_.result = status;
    pb::JoinResponse out;
    grpc::Status s = Join(Request(), &out);
    EXPECT_EQ(s.error_code(), code) << status;
    EXPECT_NE(s.error_message().find(std::string(status.message())),
              std::string::npos)
        << s.error_message();
    EXPECT_EQ(out.epoch(), 0u);
  }
}

TEST_F(CpGroupServiceTest, RendezvousSetGet) {
  std::string value;
  EXPECT_EQ(Get("k", 0, &value).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Set("k", std::string("a\0b", 3)).ok());
  ASSERT_TRUE(Get("k", 0, &value).ok());
  EXPECT_EQ(value, std::string("a\0b", 3));
  EXPECT_TRUE(Set("k", std::string("a\0b", 3)).ok());
  EXPECT_EQ(Set("k", "other").error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Set("", "v").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CpGroupServiceTest, RendezvousWaitSeesALaterSet) {
  auto waiter = std::async(std::launch::async, [this] {
    std::string value;
    grpc::Status s = Get("late", 60000, &value);
    return std::make_pair(s.error_code(), value);
  });
  ASSERT_TRUE(Set("late", "v").ok());
  auto [code, value] = waiter.get();
  EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_EQ(value, "v");
}

TEST_F(CpGroupServiceTest, RendezvousWaitTimesOutNotFound) {
  std::string value;
  EXPECT_EQ(Get("never", 20, &value).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(CpGroupServiceTest, RendezvousCaps) {
  std::string value;
  EXPECT_EQ(Set(std::string(65, 'k'), "v").error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Get(std::string(65, 'k'), 0, &value).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Set("k", std::string(129, 'v')).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(Set("a", "1").ok());
  ASSERT_TRUE(Set("b", "2").ok());
  EXPECT_EQ(Set("c", "3").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(kv_.num_keys(), 2u);
}

TEST_F(CpGroupServiceTest, ShutDownStoreIsUnavailable) {
  kv_.Shutdown();
  std::string value;
  EXPECT_EQ(Set("a", "1").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Get("a", 10, &value).error_code(), grpc::StatusCode::UNAVAILABLE);
}


// With a caller resolver, only operators (the group's daemons, by TLS
// certificate) may call; anyone else is refused and nothing changes.
TEST_F(CpGroupServiceTest, NonOperatorsAreRefusedWhenMembersAreChecked) {
  FixedCallerResolver clients(Caller::Client("cert CN=intruder"));
  CpGroupService guarded("g", &handler_, &kv_, &clients);
  grpc::ServerContext context;
  pb::JoinRequest join = Request();
  pb::JoinResponse joined;
  grpc::Status s = guarded.Join(&context, &join, &joined);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(s.error_message().find("intruder"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(handler_.calls, 0);
  pb::RendezvousSetRequest set;
  set.set_key("cp/g/1/b/0");
  set.set_value("addr");
  pb::RendezvousSetResponse set_out;
  grpc::ServerContext set_context;
  EXPECT_EQ(guarded.RendezvousSet(&set_context, &set, &set_out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(kv_.num_keys(), 0u);
  pb::RendezvousGetRequest get;
  get.set_key("cp/g/1/b/0");
  pb::RendezvousGetResponse get_out;
  grpc::ServerContext get_context;
  EXPECT_EQ(guarded.RendezvousGet(&get_context, &get, &get_out).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  FixedCallerResolver operators(Caller::Operator("cert CN=node-2"));
  CpGroupService open("g", &handler_, &kv_, &operators);
  grpc::ServerContext ok_context;
  EXPECT_TRUE(open.Join(&ok_context, &join, &joined).ok());
  EXPECT_EQ(handler_.calls, 1);
}

}  // namespace
}  // namespace hicache::service
