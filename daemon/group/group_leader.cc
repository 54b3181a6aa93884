#include "daemon/group/group_leader.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/check.h"
#include "daemon/core/log_format.h"
#include "spdlog/spdlog.h"

namespace hicache::group {
namespace {

// "rank 1", "ranks 2-3" (RangesText, which also says "ranks 2-3, rank 5"
// for a list with gaps).
std::string DescribeRanks(const std::vector<Rank>& ranks) {
  return ranks.empty() ? "no rank" : RangesText(ranks);
}

GroupMemberTransfer ToTransfer(const RemoteTransferEngine::Stats& s,
                               absl::Time now) {
  return GroupMemberTransfer{
      .steps_sent = s.steps_submitted,
      .steps_completed = s.steps_completed,
      .steps_failed = s.steps_failed,
      .outstanding = s.outstanding,
      .step_timeouts = s.step_timeouts,
      .digests_sent = s.digests_sent,
      .digests_matched = s.digests_matched,
      .digest_divergences = s.digest_divergences,
      .last_digest_match_age =
          s.last_digest_match == absl::InfinitePast()
              ? absl::InfiniteDuration()
              : std::max(absl::ZeroDuration(), now - s.last_digest_match)};
}

GroupMemberEvents ToEvents(const EventForwarder::SinkStats& s) {
  return GroupMemberEvents{.events_queued = s.events_queued,
                           .events_sent = s.events_sent,
                           .frames_sent = s.frames_sent,
                           .events_waiting = s.events_waiting,
                           .failed = s.failed};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GroupLeader>> GroupLeader::Create(
    GroupLeaderOptions options, HiCacheEngine* engine,
    RoutingTransferEngine* routing) {
  if (engine == nullptr || routing == nullptr) {
    return absl::InvalidArgumentError(
        "CP group leader needs the engine and its routing transfer engine");
  }
  if (options.cp_size != options.geometry.cp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CP group leader: cp_size ", options.cp_size,
        " differs from its geometry's ", options.geometry.cp_size));
  }
  const MemberRanks self{.name = "leader", .ranks = options.geometry.ranks};
  if (absl::Status s = CheckRankAssignment(options.cp_size, {&self, 1},
                                           RankCoverage::kPartial);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CP group leader ranks: ", s.message()));
  }
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError(
        "CP group leader: the heartbeat interval must be positive and the "
        "timeout above it");
  }
  std::vector<Rank> remote;
  for (Rank r = 0; r < options.cp_size; ++r) {
    if (std::find(self.ranks.begin(), self.ranks.end(), r) ==
        self.ranks.end()) {
      remote.push_back(r);
    }
  }
  if (!remote.empty()) {
    if (absl::Status s = engine->SetLaneAvailability(remote, false); !s.ok()) {
      return s;
    }
  }
  return std::unique_ptr<GroupLeader>(
      new GroupLeader(std::move(options), engine, routing));
}

GroupLeader::GroupLeader(GroupLeaderOptions options, HiCacheEngine* engine,
                         RoutingTransferEngine* routing)
    : options_(std::move(options)),
      engine_(engine),
      routing_(routing),
      thread_([this] { Run(); }) {}

GroupLeader::~GroupLeader() { Stop(); }

void GroupLeader::Run() {
  while (true) {
    {
      MutexLock lock(&mu_);
      while (deaths_.empty() && !stopping_) wake_.Wait(&mu_);
      if (stopping_) return;  // Stop handles what is left.
    }
    MutexLock ops(&ops_mu_);
    HandleDeathsLocked();
  }
}

absl::StatusOr<Admission> GroupLeader::Admit(
    const std::string& member_name, const GroupGeometry& geometry,
    std::unique_ptr<comm::Communicator> link) {
  auto shared =
      std::make_shared<std::unique_ptr<comm::Communicator>>(std::move(link));
  return Admit(member_name, geometry,
               [shared](const Admission&)
                   -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
                 if (*shared == nullptr) {
                   return absl::InvalidArgumentError("no link to the member");
                 }
                 return std::move(*shared);
               });
}

absl::StatusOr<Admission> GroupLeader::Admit(const std::string& member_name,
                                             const GroupGeometry& geometry,
                                             const ConnectFn& connect) {
  // Admissions one at a time (held across connect, which may take the
  // rendezvous's time); deaths are handled meanwhile (ops_mu_ is not held).
  MutexLock admit(&admit_mu_);
  if (absl::Status s = CheckGeometry(options_.geometry, geometry, member_name);
      !s.ok()) {
    return s;
  }
  Admission admission;
  int slot = -1;  // Index into members_ of the dead member taken over.
  {
    MutexLock ops(&ops_mu_);
    HandleDeathsLocked();  // A dead slot is free only once its lanes dropped.
    if (stopped_) {
      return absl::FailedPreconditionError(
          absl::StrCat("CP group ", options_.group_name, " is stopped"));
    }
    // Only admissions revive members, so what is checked here holds until
    // the member is installed below (deaths only free ranks).
    MutexLock lock(&mu_);
    std::vector<MemberRanks> live{
        {.name = "leader", .ranks = options_.geometry.ranks}};
    for (size_t i = 0; i < members_.size(); ++i) {
      const Member& m = members_[i];
      if (m.live) {
        live.push_back({.name = m.name, .ranks = m.ranks});
        continue;
      }
      if (m.ranks == geometry.ranks) {
        if (m.remote != nullptr || m.health != nullptr) {
          // Its death was noted after HandleDeathsLocked above and is not
          // handled yet: its lanes are not dropped. Taking the slot now
          // would skip the drop (the death's epoch would no longer match).
          return absl::UnavailableError(absl::StrCat(
              "CP group member ", absl::CEscape(m.name), " with ",
              DescribeRanks(m.ranks), " is still being retired; retry"));
        }
        slot = static_cast<int>(i);
        continue;
      }
      for (Rank r : geometry.ranks) {
        if (std::find(m.ranks.begin(), m.ranks.end(), r) != m.ranks.end()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "CP group member ", absl::CEscape(member_name), " serves ",
              DescribeRanks(geometry.ranks), ", which overlaps the ",
              DescribeRanks(m.ranks), " of dead member ", absl::CEscape(m.name),
              " in part; rejoin with exactly those ranks"));
        }
      }
    }
    live.push_back({.name = member_name, .ranks = geometry.ranks});
    if (absl::Status s =
            CheckRankAssignment(options_.cp_size, live, RankCoverage::kPartial);
        !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("CP group ", options_.group_name, " refuses member ",
                       absl::CEscape(member_name), ": ", s.message()));
    }
    admission.epoch = ++last_epoch_;
    admission.readmitted = slot >= 0;
    admission.member_index = slot >= 0
                                 ? members_[slot].index
                                 : static_cast<uint32_t>(members_.size() + 1);
  }

  absl::StatusOr<std::unique_ptr<comm::Communicator>> link = connect(admission);
  if (!link.ok()) return link.status();
  if (*link == nullptr) {
    return absl::InternalError("CP group: connect returned no link");
  }

  const uint32_t index = admission.member_index;
  const uint64_t epoch = admission.epoch;
  const std::string label =
      absl::StrCat("follower ", index, " (", absl::CEscape(member_name), ")");
  auto remote = std::make_shared<RemoteTransferEngine>(
      RemoteMember{.name = label,
                   .ranks = geometry.ranks,
                   .num_steps = geometry.num_steps,
                   .device_pages_per_rank =
                       static_cast<int64_t>(geometry.device_pages_per_rank),
                   .host_pages_per_rank =
                       static_cast<int64_t>(geometry.host_pages_per_rank)},
      *std::move(link), epoch, routing_->listener(),
      [this, index, epoch](const Frame& frame) {
        return OnControl(index, epoch, frame);
      },
      options_.remote,
      [this, index, epoch](const absl::Status& cause) {
        OnLinkFailed(index, epoch, cause);
      });
  absl::StatusOr<std::unique_ptr<MemberHealth>> health = MemberHealth::Create(
      MemberHealthOptions{.peer = label,
                          .member_index = 0,
                          .interval = options_.heartbeat_interval,
                          .timeout = options_.heartbeat_timeout},
      [remote](const FrameBody& body) { return remote->SendControl(body); },
      [this, index, epoch](const absl::Status& reason) {
        NoteDeath(index, epoch, reason);
      });
  if (!health.ok()) return health.status();
  MemberHealth* const watch = health->get();
  MutexLock ops(&ops_mu_);
  if (stopped_) {
    return absl::FailedPreconditionError(
        absl::StrCat("CP group ", options_.group_name,
                     " stopped while admitting ", absl::CEscape(member_name)));
  }
  // Deaths noted during connect are handled first (a retired slot must have
  // its lanes dropped before it is reused).
  HandleDeathsLocked();
  {
    MutexLock lock(&mu_);
    Member* m;
    if (slot >= 0) {
      m = &members_[slot];
      // Only admissions revive a member, and admissions are serialized: the
      // slot chosen above is still retired.
      HICACHE_CHECK(!m->live && m->remote == nullptr && m->health == nullptr,
                    "a CP group slot reused before it was retired");
      ++m->readmissions;
    } else {
      members_.emplace_back();
      m = &members_.back();
      m->index = index;
    }
    m->name = member_name;
    m->ranks = geometry.ranks;
    m->epoch = epoch;
    m->live = true;
    m->serving = false;  // Until its lanes are available (below).
    m->reason.clear();
    m->remote = remote;
    m->health = *std::move(health);
    m->last_health = MemberHealthSnapshot{};
    m->last_remote = RemoteTransferEngine::Stats{};
    m->last_events.reset();
  }
  // From here a failure is a death like any other (handled after this
  // admission, since the handler needs ops_mu_).
  if (absl::Status s = routing_->SetRoute(geometry.ranks, remote); !s.ok()) {
    NoteDeath(index, epoch, s);
  }
  if (absl::Status s = remote->Start(); !s.ok()) NoteDeath(index, epoch, s);
  if (absl::Status s = watch->Start(); !s.ok()) NoteDeath(index, epoch, s);
  if (absl::Status s = engine_->SetLaneAvailability(geometry.ranks, true);
      !s.ok()) {
    NoteDeath(index, epoch, s);
  }
  if (options_.events != nullptr) {
    // Its workers' events, from now on. The sink holds the engine weakly:
    // RetireLocked detaches it before it lets the engine go.
    std::weak_ptr<RemoteTransferEngine> weak = remote;
    absl::StatusOr<uint64_t> sink = options_.events->Attach(
        label, geometry.ranks,
        [weak](const FrameBody& body) -> absl::Status {
          std::shared_ptr<RemoteTransferEngine> r = weak.lock();
          if (r == nullptr) return absl::UnavailableError("member retired");
          return r->SendControl(body);
        },
        [this, index, epoch](const absl::Status& cause) {
          NoteDeath(index, epoch, cause);
        });
    if (!sink.ok()) {
      NoteDeath(index, epoch, sink.status());
    } else {
      bool kept = false;
      {
        MutexLock lock(&mu_);
        Member& m = members_[index - 1];
        if (m.epoch == epoch && m.remote != nullptr) {
          m.event_sink = *sink;
          kept = true;
        }
      }
      // Not under mu_: Detach waits for an on_fail, which takes mu_.
      if (!kept) options_.events->Detach(*sink);
    }
  }
  {
    // Only now do its ranks count as served ("formed"): a scheduler that
    // acts on the state never meets lanes still unavailable.
    MutexLock lock(&mu_);
    Member& m = members_[index - 1];
    if (m.epoch == epoch && m.live) m.serving = true;
  }
  spdlog::info("CP group {}: {} {} with {} (epoch {})", options_.group_name,
               admission.readmitted ? "readmitted" : "admitted", label,
               DescribeRanks(geometry.ranks), epoch);
  return admission;
}

absl::Status GroupLeader::OnControl(uint32_t index, uint64_t epoch,
                                    const Frame& frame) {
  if (frame.header.kind == FrameKind::kBye) {
    NoteDeath(index, epoch,
              absl::UnavailableError(absl::StrCat(
                  "it said bye: ", std::get<Bye>(frame.body).reason)));
    return absl::OkStatus();
  }
  if (frame.header.kind == FrameKind::kWorkerEvents ||
      frame.header.kind == FrameKind::kLayerStoredAck) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a follower sent a ",
        FrameKindName(static_cast<uint8_t>(frame.header.kind)), " frame"));
  }
  {
    MutexLock lock(&mu_);
    if (index == 0 || index > members_.size()) return absl::OkStatus();
    Member& m = members_[index - 1];
    if (m.epoch == epoch && m.health != nullptr)
      m.health->Heard(frame.header.kind);
  }
  if (frame.header.kind == FrameKind::kLayerStored) {
    OnLayerStored(index, epoch, std::get<LayerStoredRequest>(frame.body));
  }
  return absl::OkStatus();
}

void GroupLeader::OnLinkFailed(uint32_t index, uint64_t epoch,
                               const absl::Status& cause) {
  // Under mu_, like Heard: the health is only reached through members_,
  // which RetireLocked empties before it destroys the health. LinkFailed
  // takes the health's leaf lock and only wakes its thread, which then
  // calls on_dead (NoteDeath) without any lock of ours held.
  MutexLock lock(&mu_);
  if (index == 0 || index > members_.size()) return;  // Never installed.
  Member& m = members_[index - 1];
  // Another admission's slot, or being retired (its health is stopped).
  if (m.epoch != epoch || m.health == nullptr) return;
  m.health->LinkFailed(cause);
}

void GroupLeader::OnLayerStored(uint32_t index, uint64_t epoch,
                                const LayerStoredRequest& request) {
  // The engine that called us runs this on its own link thread: it cannot be
  // destroyed before we return (its destruction joins that thread).
  RemoteTransferEngine* remote = nullptr;
  std::vector<Rank> ranks;
  std::string name;
  bool live = false;
  {
    MutexLock lock(&mu_);
    if (index == 0 || index > members_.size()) return;
    Member& m = members_[index - 1];
    if (m.epoch != epoch || m.remote == nullptr) return;  // Being retired.
    remote = m.remote.get();
    ranks = m.ranks;
    name = m.name;
    live = m.live;
  }
  absl::Status status;
  if (!live) {
    status = absl::UnavailableError(
        absl::StrCat("CP group member ", absl::CEscape(name),
                     " is no longer part of group ", options_.group_name));
  } else if (std::find(ranks.begin(), ranks.end(), request.rank) ==
             ranks.end()) {
    status = absl::PermissionDeniedError(absl::StrCat(
        "CP group member ", absl::CEscape(name), " holds ",
        DescribeRanks(ranks), ", not rank ", request.rank,
        "; its workers ack only their own ranks"));
  } else if (request.ops.size() > kMaxLayerStoredOps) {
    status = absl::InvalidArgumentError(
        absl::StrCat("layer_stored names ", request.ops.size(),
                     " ops; the limit is ", kMaxLayerStoredOps));
  } else if (request.ns.size() > kMaxLayerStoredNamespaceBytes) {
    status = absl::InvalidArgumentError(
        absl::StrCat("layer_stored namespace of ", request.ns.size(),
                     " bytes; the limit is ", kMaxLayerStoredNamespaceBytes));
  } else if (!options_.layer_stored) {
    status = absl::UnimplementedError(absl::StrCat(
        "CP group ", options_.group_name,
        " leader does not take worker acks from followers"));
  } else {
    status = options_.layer_stored(request.ns, request.rank, request.step,
                                   request.ops);
  }
  if (absl::Status sent = remote->SendControl(
          LayerStoredAck{.request_id = request.request_id, .status = status});
      !sent.ok()) {
    spdlog::debug("CP group {}: no layer_stored ack to {}: {}",
                  options_.group_name, absl::CEscape(name), sent);
  }
}

void GroupLeader::NoteDeath(uint32_t index, uint64_t epoch,
                            const absl::Status& cause) {
  MutexLock lock(&mu_);
  if (index == 0 || index > members_.size()) return;
  Member& m = members_[index - 1];
  if (m.epoch != epoch || !m.live) return;  // Reported already, or stale.
  m.live = false;
  m.reason = absl::StrCat("CP group member ", absl::CEscape(m.name), " (",
                          DescribeRanks(m.ranks), ") lost: ", cause.message());
  spdlog::error("CP group {}: {}", options_.group_name, m.reason);
  ++deaths_noted_;
  deaths_.push_back({index, epoch});
  wake_.SignalAll();
}

void GroupLeader::HandleDeathsLocked() {
  while (true) {
    std::vector<Rank> ranks;
    std::shared_ptr<RemoteTransferEngine> remote;
    std::unique_ptr<MemberHealth> health;
    std::string reason;
    uint32_t index = 0;
    uint64_t sink = 0;
    {
      MutexLock lock(&mu_);
      if (deaths_.empty()) return;
      const Death d = deaths_.front();
      deaths_.pop_front();
      index = d.index;
      Member& m = members_[d.index - 1];
      if (m.epoch == d.epoch && !m.live && m.remote != nullptr) {
        ranks = m.ranks;
        remote = std::move(m.remote);
        health = std::move(m.health);
        reason = m.reason;
        sink = std::exchange(m.event_sink, 0);
      }
    }
    if (remote != nullptr) {
      RetireLocked(ranks, std::move(remote), std::move(health),
                   absl::UnavailableError(reason), sink);
      if (options_.on_member_dead) options_.on_member_dead(index, reason);
    }
    MutexLock lock(&mu_);
    ++deaths_handled_;
    handled_.SignalAll();
  }
}

void GroupLeader::RetireLocked(const std::vector<Rank>& ranks,
                               std::shared_ptr<RemoteTransferEngine> remote,
                               std::unique_ptr<MemberHealth> health,
                               const absl::Status& cause,
                               uint64_t event_sink) {
  // No more worker events (waits for a send to it to return).
  std::optional<EventForwarder::SinkStats> last_events;
  if (options_.events != nullptr && event_sink != 0) {
    last_events = options_.events->sink_stats(event_sink);
    options_.events->Detach(event_sink);
  }
  // No more heartbeats; on_dead will not run again (it may be what told us).
  if (health != nullptr) health->Stop();
  remote->Fail(cause);
  routing_->ClearRoute(ranks);
  // Also a barrier: the engine submits under its lock, so once this returns
  // no Submit still holds the route just cleared.
  if (absl::Status s = engine_->SetLaneAvailability(ranks, false); !s.ok()) {
    spdlog::error("CP group {}: marking {} unavailable: {}",
                  options_.group_name, DescribeRanks(ranks), s);
  }
  absl::StatusOr<LaneDropCounts> dropped = engine_->DropLanes(ranks);
  if (!dropped.ok()) {
    spdlog::error("CP group {}: dropping {}: {}", options_.group_name,
                  DescribeRanks(ranks), dropped.status());
  }
  const std::optional<MemberHealthSnapshot> last_health =
      health != nullptr ? std::optional(health->snapshot()) : std::nullopt;
  health.reset();  // Drops its reference to the engine.
  remote->Drain();
  // Frozen for Status (its steps failed by now).
  const RemoteTransferEngine::Stats last_remote = remote->stats();
  {
    MutexLock lock(&mu_);
    for (Member& m : members_) {
      if (m.ranks != ranks || m.remote != nullptr) continue;
      if (last_health.has_value()) m.last_health = *last_health;
      m.last_remote = last_remote;
      if (last_events.has_value()) m.last_events = last_events;
    }
  }
  if (remote.use_count() != 1) {
    // A Status snapshot may hold it for a moment; it then goes there.
    spdlog::warn("CP group {}: the engine of {} is still referenced",
                 options_.group_name, DescribeRanks(ranks));
  }
  remote.reset();  // Joins its threads (no lock of ours or the engine's).
}

void GroupLeader::AwaitDeathsHandled() {
  MutexLock lock(&mu_);
  const int64_t target = deaths_noted_;
  while (deaths_handled_ < target && !stopping_) handled_.Wait(&mu_);
}

GroupState GroupLeader::StateLocked() const {
  if (stopping_) return GroupState::kStopped;
  std::vector<bool> served(options_.cp_size, false);
  for (Rank r : options_.geometry.ranks) served[r] = true;
  bool any_dead = false;
  for (const Member& m : members_) {
    if (!m.live) {
      any_dead = true;
      continue;
    }
    if (!m.serving) continue;  // Admitted, lanes not available yet.
    for (Rank r : m.ranks) served[r] = true;
  }
  if (std::all_of(served.begin(), served.end(), [](bool b) { return b; })) {
    return GroupState::kFormed;
  }
  return any_dead ? GroupState::kDegraded : GroupState::kForming;
}

GroupStatus GroupLeader::Status() const {
  GroupStatus status{.name = options_.group_name,
                     .role = GroupRole::kLeader,
                     .cp_size = options_.cp_size};
  status.members.push_back(GroupMemberStatus{
      .index = 0, .name = "leader", .ranks = options_.geometry.ranks});
  // The live engines and sinks, read below without mu_.
  struct Live {
    std::shared_ptr<RemoteTransferEngine> remote;
    uint64_t event_sink = 0;
  };
  std::vector<Live> live;
  {
    MutexLock lock(&mu_);
    status.state = StateLocked();
    status.epoch = last_epoch_;
    status.deaths = deaths_noted_;
    live.reserve(members_.size());
    for (const Member& m : members_) {
      const MemberHealthSnapshot h =
          m.health != nullptr ? m.health->snapshot() : m.last_health;
      GroupMemberStatus member{.index = m.index,
                               .name = m.name,
                               .ranks = m.ranks,
                               .epoch = m.epoch,
                               .live = m.live,
                               .last_heard_age = h.last_heard_age,
                               .reason = m.reason,
                               .readmissions = m.readmissions,
                               .heartbeats_sent = h.heartbeats_sent,
                               .heartbeats_received = h.heartbeats_received};
      // Every member in members_ was admitted (its engine built).
      member.has_transfer = true;
      member.transfer = ToTransfer(m.last_remote, absl::Now());
      if (m.last_events.has_value()) {
        member.has_events = true;
        member.events = ToEvents(*m.last_events);
      }
      status.members.push_back(std::move(member));
      live.push_back({m.remote, m.event_sink});
    }
  }
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < live.size(); ++i) {
    GroupMemberStatus& member = status.members[i + 1];
    if (live[i].remote != nullptr) {
      member.transfer = ToTransfer(live[i].remote->stats(), now);
    }
    if (options_.events != nullptr && live[i].event_sink != 0) {
      if (std::optional<EventForwarder::SinkStats> e =
              options_.events->sink_stats(live[i].event_sink);
          e.has_value()) {
        member.has_events = true;
        member.events = ToEvents(*e);
      }
    }
  }
  // Dropped here, with no lock held; a retirement that raced with this
  // snapshot may leave the engine's last reference (and its destruction)
  // to this thread.
  live.clear();
  return status;
}

void GroupLeader::Stop() {
  bool join = false;
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      join = true;
      wake_.SignalAll();
      handled_.SignalAll();
    }
  }
  // Joined without ops_mu_: the thread may be waiting for it.
  if (join) thread_.join();
  MutexLock ops(&ops_mu_);
  if (stopped_) return;
  stopped_ = true;
  HandleDeathsLocked();
  struct Live {
    std::vector<Rank> ranks;
    std::shared_ptr<RemoteTransferEngine> remote;
    std::unique_ptr<MemberHealth> health;
    uint64_t event_sink = 0;
  };
  std::vector<Live> live;
  {
    MutexLock lock(&mu_);
    for (Member& m : members_) {
      if (m.remote == nullptr) continue;
      m.live = false;
      m.reason = "the leader stopped";
      live.push_back({m.ranks, std::move(m.remote), std::move(m.health),
                      std::exchange(m.event_sink, 0)});
    }
  }
  for (Live& l : live) {
    absl::Status bye = l.remote->SendControl(
        Bye{.reason = absl::StrCat("CP group ", options_.group_name,
                                   " leader stopping")});
    if (!bye.ok()) {  // A dead link needs no Bye.
      spdlog::debug("CP group {}: no bye to {}: {}", options_.group_name,
                    DescribeRanks(l.ranks), bye);
    }
    RetireLocked(l.ranks, std::move(l.remote), std::move(l.health),
                 absl::UnavailableError("the CP group leader stopped"),
                 l.event_sink);
  }
}

}  // namespace hicache::group
