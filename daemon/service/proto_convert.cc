#include "daemon/service/proto_convert.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace hicache::service {

v1::Backend ToProto(BackendKind backend) {
  switch (backend) {
    case BackendKind::kCpu:
      return v1::BACKEND_CPU;
    case BackendKind::kCuda:
      return v1::BACKEND_CUDA;
  }
  return v1::BACKEND_UNSPECIFIED;
}

v1::HostLayout ToProto(HostLayout layout) {
  switch (layout) {
    case HostLayout::kLayerFirst:
      return v1::HOST_LAYOUT_LAYER_FIRST;
    case HostLayout::kPageFirst:
      return v1::HOST_LAYOUT_PAGE_FIRST;
  }
  return v1::HOST_LAYOUT_UNSPECIFIED;
}

void ToProto(const BuildInfo& build, v1::BuildInfo* out) {
  out->set_version(build.version);
  out->set_git_revision(build.git_revision);
  out->set_compiler(build.compiler);
  out->set_build_mode(build.build_mode);
  out->set_cuda_support(build.cuda_support);
  out->set_proto_package(v1::GetStatsResponse::descriptor()->file()->package());
}

void ToProto(const DaemonConfig& config, v1::PoolGeometry* out) {
  out->set_page_size_tokens(config.page_size);
  out->set_cp_size(config.cp_size);
  for (uint32_t rank : config.EffectiveRanks()) out->add_served_ranks(rank);
  out->set_device_pages_per_rank(config.device_pages_per_rank);
  out->set_host_pages_per_rank(config.host_pages_per_rank);
  out->set_logical_device_pages(config.LogicalDevicePages());
  out->set_host_layout(ToProto(config.host_layout));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numeric values.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

namespace {

// Milliseconds, or -1 for "never" (an infinite age).
int64_t AgeMs(absl::Duration age) {
  if (age == absl::InfiniteDuration()) return -1;
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(age));
}

}  // namespace

void ToProto(const group::GroupStatus& status, absl::string_view leader_address,
             v1::CpGroupStatus* out) {
  out->Clear();
  out->set_name(status.name);
  out->set_role(group::GroupRoleName(status.role));
  out->set_state(group::GroupStateName(status.state));
  out->set_cp_size(status.cp_size);
  out->set_epoch(status.epoch);
  out->set_leader_address(std::string(leader_address));
  out->set_reason(status.reason);
  out->set_deaths(status.deaths);
  for (const group::GroupMemberStatus& m : status.members) {
    v1::CpGroupMember* member = out->add_members();
    member->set_index(m.index);
    member->set_name(m.name);
    std::vector<Rank> ranks = m.ranks;
    std::sort(ranks.begin(), ranks.end());
    member->mutable_ranks()->Add(ranks.begin(), ranks.end());
    member->set_epoch(m.epoch);
    // Not live with no death recorded: not heard from yet (a follower
    // before it ran).
    member->set_health(m.live ? "live" : m.reason.empty() ? "unknown" : "dead");
    member->set_last_heard_age_ms(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(m.last_heard_age)));
    member->set_reason(m.reason);
    member->set_readmissions(m.readmissions);
    member->set_heartbeats_sent(m.heartbeats_sent);
    member->set_heartbeats_received(m.heartbeats_received);
    if (m.has_transfer) {
      v1::CpGroupMemberTransfer* t = member->mutable_transfer();
      t->set_steps_sent(m.transfer.steps_sent);
      t->set_steps_completed(m.transfer.steps_completed);
      t->set_steps_failed(m.transfer.steps_failed);
      t->set_outstanding(m.transfer.outstanding);
      t->set_step_timeouts(m.transfer.step_timeouts);
      t->set_digests_sent(m.transfer.digests_sent);
      t->set_digests_matched(m.transfer.digests_matched);
      t->set_digest_divergences(m.transfer.digest_divergences);
      t->set_last_digest_match_age_ms(AgeMs(m.transfer.last_digest_match_age));
    }
    if (m.has_events) {
      v1::CpGroupMemberEvents* e = member->mutable_events();
      e->set_events_queued(m.events.events_queued);
      e->set_events_sent(m.events.events_sent);
      e->set_frames_sent(m.events.frames_sent);
      e->set_events_waiting(m.events.events_waiting);
      e->set_failed(m.events.failed);
    }
  }
  if (status.role == group::GroupRole::kFollower) {
    const group::GroupFollowerCounters& c = status.follower;
    v1::CpGroupFollowerStats* f = out->mutable_follower();
    f->set_tasks_received(c.tasks_received);
    f->set_steps_executed(c.steps_executed);
    f->set_steps_refused(c.steps_refused);
    f->set_steps_rejected(c.steps_rejected);
    f->set_pending(c.pending);
    f->set_digests_checked(c.digests_checked);
    f->set_digests_matched(c.digests_matched);
    f->set_diverged(c.diverged);
    f->set_last_digest_match_age_ms(AgeMs(c.last_digest_match_age));
    f->set_acks_relayed(c.acks_relayed);
    f->set_acks_failed(c.acks_failed);
  }
}

}  // namespace hicache::service
