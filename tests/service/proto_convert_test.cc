#include "daemon/service/proto_convert.h"

#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "daemon/group/group_status.h"
#include "gtest/gtest.h"

namespace hicache::service {
namespace {

TEST(ProtoConvertTest, BackendKind) {
  EXPECT_EQ(ToProto(BackendKind::kCpu), v1::BACKEND_CPU);
  EXPECT_EQ(ToProto(BackendKind::kCuda), v1::BACKEND_CUDA);
}

TEST(ProtoConvertTest, HostLayout) {
  EXPECT_EQ(ToProto(HostLayout::kLayerFirst), v1::HOST_LAYOUT_LAYER_FIRST);
  EXPECT_EQ(ToProto(HostLayout::kPageFirst), v1::HOST_LAYOUT_PAGE_FIRST);
}

TEST(ProtoConvertTest, BuildInfo) {
  BuildInfo build{.version = "1.2.3",
                  .git_revision = "0123456789ab-dirty",
                  .compiler = "gcc 12.2.0",
                  .build_mode = "opt+asan",
                  .cuda_support = true};
  v1::BuildInfo out;
  ToProto(build, &out);
  EXPECT_EQ(out.version(), "1.2.3");
  EXPECT_EQ(out.git_revision(), "0123456789ab-dirty");
  EXPECT_EQ(out.compiler(), "gcc 12.2.0");
  EXPECT_EQ(out.build_mode(), "opt+asan");
  EXPECT_TRUE(out.cuda_support());
  EXPECT_EQ(out.proto_package(), "hicache.v1");
}

TEST(ProtoConvertTest, GeometryExpandsDefaultRanks) {
  DaemonConfig config;
  config.page_size = 32;
  config.cp_size = 4;
  config.device_pages_per_rank = 100;
  config.host_pages_per_rank = 300;
  config.host_layout = HostLayout::kPageFirst;
  v1::PoolGeometry out;
  ToProto(config, &out);
  EXPECT_EQ(out.page_size_tokens(), 32u);
  EXPECT_EQ(out.cp_size(), 4u);
  ASSERT_EQ(out.served_ranks_size(), 4);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(out.served_ranks(r), r);
  EXPECT_EQ(out.device_pages_per_rank(), 100u);
  EXPECT_EQ(out.host_pages_per_rank(), 300u);
  EXPECT_EQ(out.logical_device_pages(), 400u);
  EXPECT_EQ(out.host_layout(), v1::HOST_LAYOUT_PAGE_FIRST);
}

TEST(ProtoConvertTest, StatusCodesAndMessagesSurvive) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const grpc::Status s =
      ToGrpcStatus(absl::InvalidArgumentError("page_ids[3] out of range"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "page_ids[3] out of range");
  EXPECT_EQ(ToGrpcStatus(absl::NotFoundError("x")).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("x")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

group::GroupStatus LeaderWithTwoMembers() {
  group::GroupStatus status{.name = "g1",
                            .role = group::GroupRole::kLeader,
                            .state = group::GroupState::kDegraded,
                            .cp_size = 8,
                            .epoch = 3,
                            .deaths = 1};
  status.members.push_back({.index = 0, .name = "leader", .ranks = {1, 0}});
  status.members.push_back({.index = 1,
                            .name = "node-b",
                            .ranks = {4, 5, 6, 7},
                            .epoch = 2,
                            .live = true,
                            .last_heard_age = absl::Milliseconds(12.7),
                            .readmissions = 1,
                            .heartbeats_sent = 40,
                            .heartbeats_received = 39});
  status.members.push_back({.index = 2,
                            .name = "node-c",
                            .ranks = {3, 2},
                            .epoch = 3,
                            .live = false,
                            .last_heard_age = absl::Seconds(2),
                            .reason = "heartbeat timeout after 1s"});
  return status;
}

TEST(ProtoConvertTest, GroupLeaderWithTwoMembersOneDead) {
  v1::CpGroupStatus out;
  ToProto(LeaderWithTwoMembers(), "10.0.0.1:7070", &out);
  EXPECT_EQ(out.name(), "g1");
  EXPECT_EQ(out.role(), "leader");
  EXPECT_EQ(out.state(), "degraded");
  EXPECT_EQ(out.cp_size(), 8u);
  EXPECT_EQ(out.epoch(), 3u);
  EXPECT_EQ(out.leader_address(), "10.0.0.1:7070");
  EXPECT_EQ(out.deaths(), 1);
  EXPECT_EQ(out.reason(), "");
  ASSERT_EQ(out.members_size(), 3);

  const v1::CpGroupMember& self = out.members(0);
  EXPECT_EQ(self.index(), 0u);
  EXPECT_EQ(self.name(), "leader");
  EXPECT_EQ(std::vector<uint32_t>(self.ranks().begin(), self.ranks().end()),
            (std::vector<uint32_t>{0, 1}));  // Sorted.
  EXPECT_EQ(self.health(), "live");
  EXPECT_EQ(self.last_heard_age_ms(), 0);

  const v1::CpGroupMember& b = out.members(1);
  EXPECT_EQ(b.index(), 1u);
  EXPECT_EQ(b.name(), "node-b");
  EXPECT_EQ(std::vector<uint32_t>(b.ranks().begin(), b.ranks().end()),
            (std::vector<uint32_t>{4, 5, 6, 7}));
  EXPECT_EQ(b.epoch(), 2u);
  EXPECT_EQ(b.health(), "live");
  EXPECT_EQ(b.last_heard_age_ms(), 12);  // Whole milliseconds.
  EXPECT_EQ(b.readmissions(), 1);
  EXPECT_EQ(b.heartbeats_sent(), 40);
  EXPECT_EQ(b.heartbeats_received(), 39);
  EXPECT_EQ(b.reason(), "");

  const v1::CpGroupMember& c = out.members(2);
  EXPECT_EQ(c.index(), 2u);
  EXPECT_EQ(c.health(), "dead");
  EXPECT_EQ(c.reason(), "heartbeat timeout after 1s");
  EXPECT_EQ(c.last_heard_age_ms(), 2000);
  EXPECT_EQ(std::vector<uint32_t>(c.ranks().begin(), c.ranks().end()),
            (std::vector<uint32_t>{2, 3}));
}

TEST(ProtoConvertTest, GroupFollower) {
  group::GroupStatus status{.name = "g1",
                            .role = group::GroupRole::kFollower,
                            .state = group::GroupState::kFormed,
                            .cp_size = 8,
                            .epoch = 5};
  status.members.push_back({.index = 0,
                            .name = "10.0.0.1:7071",
                            .epoch = 5,
                            .live = true,
                            .last_heard_age = absl::Milliseconds(80)});
  v1::CpGroupStatus out;
  ToProto(status, "10.0.0.1:7070", &out);
  EXPECT_EQ(out.role(), "follower");
  EXPECT_EQ(out.state(), "formed");
  EXPECT_EQ(out.epoch(), 5u);
  EXPECT_EQ(out.leader_address(), "10.0.0.1:7070");
  ASSERT_EQ(out.members_size(), 1);
  EXPECT_EQ(out.members(0).name(), "10.0.0.1:7071");
  EXPECT_EQ(out.members(0).health(), "live");
  EXPECT_EQ(out.members(0).last_heard_age_ms(), 80);
}

TEST(ProtoConvertTest, GroupFollowerBeforeRunAndAfterLoss) {
  group::GroupStatus status{.name = "g",
                            .role = group::GroupRole::kFollower,
                            .state = group::GroupState::kForming};
  status.members.push_back({.index = 0, .name = "l:1", .live = false});
  v1::CpGroupStatus out;
  ToProto(status, "", &out);
  EXPECT_EQ(out.state(), "forming");
  EXPECT_EQ(out.leader_address(), "");
  EXPECT_EQ(out.members(0).health(), "unknown");  // Not heard from yet.

  status.state = group::GroupState::kDegraded;
  status.reason = "leader lost: link closed";
  status.members[0].reason = status.reason;
  status.members[0].last_heard_age = -absl::Seconds(1);  // Clock skew.
  ToProto(status, "l:1", &out);  // Replaces what `out` held.
  EXPECT_EQ(out.state(), "degraded");
  EXPECT_EQ(out.reason(), "leader lost: link closed");
  ASSERT_EQ(out.members_size(), 1);
  EXPECT_EQ(out.members(0).health(), "dead");
  EXPECT_EQ(out.members(0).last_heard_age_ms(), 0);
}

}  // namespace

TEST(ProtoConvertTest, GroupLeaderMembersCarryTheirDataPath) {
  group::GroupStatus status = LeaderWithTwoMembers();
  group::GroupMemberStatus& b = status.members[1];
  b.has_transfer = true;
  b.transfer = {.steps_sent = 12,
                .steps_completed = 11,
                .steps_failed = 1,
                .outstanding = 0,
                .step_timeouts = 1,
                .digests_sent = 4,
                .digests_matched = 3,
                .digest_divergences = 1,
                .last_digest_match_age = absl::Milliseconds(2500.9)};
  b.has_events = true;
  b.events = {.events_queued = 50,
              .events_sent = 48,
              .frames_sent = 9,
              .events_waiting = 2,
              .failed = true};
  group::GroupMemberStatus& c = status.members[2];
  c.has_transfer = true;  // Never matched a digest: age -1.
  v1::CpGroupStatus out;
  ToProto(status, "", &out);
  ASSERT_EQ(out.members_size(), 3);
  EXPECT_FALSE(out.members(0).has_transfer());  // The leader itself.
  EXPECT_FALSE(out.members(0).has_events());
  EXPECT_FALSE(out.has_follower());
  ASSERT_TRUE(out.members(1).has_transfer());
  const v1::CpGroupMemberTransfer& t = out.members(1).transfer();
  EXPECT_EQ(t.steps_sent(), 12);
  EXPECT_EQ(t.steps_completed(), 11);
  EXPECT_EQ(t.steps_failed(), 1);
  EXPECT_EQ(t.outstanding(), 0);
  EXPECT_EQ(t.step_timeouts(), 1);
  EXPECT_EQ(t.digests_sent(), 4);
  EXPECT_EQ(t.digests_matched(), 3);
  EXPECT_EQ(t.digest_divergences(), 1);
  EXPECT_EQ(t.last_digest_match_age_ms(), 2500);
  ASSERT_TRUE(out.members(1).has_events());
  const v1::CpGroupMemberEvents& e = out.members(1).events();
  EXPECT_EQ(e.events_queued(), 50);
  EXPECT_EQ(e.events_sent(), 48);
  EXPECT_EQ(e.frames_sent(), 9);
  EXPECT_EQ(e.events_waiting(), 2);
  EXPECT_TRUE(e.failed());
  ASSERT_TRUE(out.members(2).has_transfer());
  EXPECT_EQ(out.members(2).transfer().last_digest_match_age_ms(), -1);
  EXPECT_EQ(out.members(2).transfer().steps_sent(), 0);
  EXPECT_FALSE(out.members(2).has_events());
}

TEST(ProtoConvertTest, GroupFollowerCarriesItsExecutorAndAcks) {
  group::GroupStatus status{.name = "g1",
                            .role = group::GroupRole::kFollower,
                            .state = group::GroupState::kFormed};
  status.members.push_back({.index = 0, .name = "l:1", .live = true});
  status.follower = {.tasks_received = 5,
                     .steps_executed = 20,
                     .steps_refused = 1,
                     .steps_rejected = 2,
                     .pending = 3,
                     .digests_checked = 4,
                     .digests_matched = 4,
                     .diverged = true,
                     .last_digest_match_age = absl::Milliseconds(70),
                     .acks_relayed = 7,
                     .acks_failed = 1};
  v1::CpGroupStatus out;
  ToProto(status, "l:1", &out);
  ASSERT_TRUE(out.has_follower());
  const v1::CpGroupFollowerStats& f = out.follower();
  EXPECT_EQ(f.tasks_received(), 5);
  EXPECT_EQ(f.steps_executed(), 20);
  EXPECT_EQ(f.steps_refused(), 1);
  EXPECT_EQ(f.steps_rejected(), 2);
  EXPECT_EQ(f.pending(), 3);
  EXPECT_EQ(f.digests_checked(), 4);
  EXPECT_EQ(f.digests_matched(), 4);
  EXPECT_TRUE(f.diverged());
  EXPECT_EQ(f.last_digest_match_age_ms(), 70);
  EXPECT_EQ(f.acks_relayed(), 7);
  EXPECT_EQ(f.acks_failed(), 1);
  EXPECT_FALSE(out.members(0).has_transfer());

  status.follower = {};  // No match yet: -1.
  ToProto(status, "l:1", &out);
  EXPECT_EQ(out.follower().last_digest_match_age_ms(), -1);
  EXPECT_EQ(out.follower().steps_executed(), 0);
}

}  // namespace hicache::service
