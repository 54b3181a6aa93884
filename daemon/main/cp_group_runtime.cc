#include "daemon/main/cp_group_runtime.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/comm/gloo_communicator.h"
#include "daemon/group/group_geometry.h"
#include "daemon/main/grpc_rendezvous_store.h"
#include "daemon/main/grpc_support.h"
#include "daemon/main/rendezvous_gloo_store.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

// How long one end of a link waits for the other at its rendezvous (Gloo's
// accept phase may take a few times this).
constexpr absl::Duration kConnectTimeout = absl::Seconds(5);
// A follower's Join RPC: the leader answers within its reply timeout (30 s,
// LeaderJoinHandler) plus slack.
constexpr absl::Duration kJoinRpcTimeout = absl::Seconds(40);
// A link's rendezvous keys outlive its leader end's connect by this much:
// Gloo's accept phase may take a few connect timeouts.
constexpr absl::Duration kLinkKeysGrace = absl::Seconds(30);  // 6 connects.

// One end of a member's link (rank 0: the leader's, 1: the member's),
// rendezvousing through `store` under `prefix`.
absl::StatusOr<std::unique_ptr<comm::Communicator>> ConnectLink(
    RendezvousGlooStore* store, const std::string& prefix, int rank,
    std::shared_ptr<gloo::transport::Device> device,
    absl::Duration receive_timeout) {
  absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> link =
      comm::GlooCommunicator::Connect({.store = store,
                                       .key_prefix = prefix,
                                       .rank = rank,
                                       .device = std::move(device),
                                       .connect_timeout = kConnectTimeout,
                                       .receive_timeout = receive_timeout});
  if (!link.ok()) return link.status();
  return std::unique_ptr<comm::Communicator>(*std::move(link));
}

// The follower's channel to its leader: plain for --insecure_tcp_for_testing,
// else TLS with this daemon's certificate as its client identity and
// --tls_client_ca_file as the roots the leader's certificate must chain to.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> LeaderCredentials(
    const DaemonConfig& config) {
  if (config.insecure_tcp_for_testing) {
    return grpc::InsecureChannelCredentials();
  }
  grpc::SslCredentialsOptions options;
  if (!config.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> roots =
        ReadCredentialsFile(config.tls_client_ca_file);
    if (!roots.ok()) return roots.status();
    options.pem_root_certs = *roots;
  }
  if (!config.tls_cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadCredentialsFile(config.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadCredentialsFile(config.tls_key_file);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *cert;
    options.pem_private_key = *key;
  }
  return grpc::SslCredentials(options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpGroupRuntime>> CpGroupRuntime::Create(
    const DaemonConfig& config, const std::string& instance) {
  std::unique_ptr<CpGroupRuntime> runtime(new CpGroupRuntime(
      config, config.cp_group.member.empty() ? instance
                                             : config.cp_group.member));
  absl::StatusOr<std::shared_ptr<gloo::transport::Device>> device =
      comm::GlooCommunicator::CreateTcpDevice(config.cp_group.bind);
  if (!device.ok()) {
    return absl::Status(device.status().code(),
                        absl::StrCat("--cp_group_bind: ",
                                     device.status().message()));
  }
  runtime->device_ = *std::move(device);
  return runtime;
}

CpGroupRuntime::CpGroupRuntime(const DaemonConfig& config, std::string member)
    : config_(config),
      member_(std::move(member)),
      leader_role_(config.cp_group.is_leader()) {}

CpGroupRuntime::~CpGroupRuntime() { Stop(); }

void CpGroupRuntime::ConfigureEngine(EngineOptions* options) {
  if (leader_role_) {
    // Every rank's acks count on the leader; its pools are its own ranks'.
    const std::vector<Rank> own = config_.EffectiveRanks();
    options->pool_ranks = own;
    options->served_ranks.clear();
    options->wrap_transfer = [this, own](TransferListener* listener,
                                         const TransferEngineFactory& backend)
        -> std::unique_ptr<TransferEngine> {
      auto routing = std::make_unique<group::RoutingTransferEngine>(
          listener, backend(listener), own);
      routing_ = routing.get();
      return routing;
    };
  }
  engine_options_ = *options;
}

absl::Status CpGroupRuntime::Attach(HiCacheEngine* engine, Backend* backend,
                                    EventHub* hub, SessionManager* sessions,
                                    const service::CallerResolver* members,
                                    FatalFn on_fatal) {
  on_fatal_ = std::move(on_fatal);
  const group::GroupGeometry geometry =
      group::GroupGeometryFrom(engine_options_, engine->geometry());
  const absl::Duration interval = absl::Milliseconds(group_.heartbeat_ms);
  const absl::Duration timeout = absl::Milliseconds(group_.timeout_ms);
  if (leader_role_) {
    if (routing_ == nullptr) {
      return absl::InternalError("the CP group's routing engine is missing");
    }
    group::GroupLeaderOptions options{
        .group_name = group_.name,
        .cp_size = config_.cp_size,
        .geometry = geometry,
        .heartbeat_interval = interval,
        .heartbeat_timeout = timeout};
    options.remote.step_timeout =
        group_.step_timeout_ms == 0 ? absl::InfiniteDuration()
                                    : absl::Milliseconds(group_.step_timeout_ms);
    options.remote.digest_interval =
        absl::Milliseconds(group_.digest_interval_ms);
    // What the hub fans out to subscribers goes to the members holding the
    // ranks too, for their workers.
    forwarder_ = std::make_shared<group::EventForwarder>();
    hub->SetSubscriberTap([forwarder = forwarder_](const OpEvent& event,
                                                   const std::string& ns) {
      forwarder->Publish(event, ns);
    });
    options.events = forwarder_.get();
    options.layer_stored = [sessions](const std::string& ns, Rank rank,
                                      uint32_t step,
                                      absl::Span<const uint64_t> ops) {
      return sessions->NamespaceLayerStored(ns, rank, ops, step);
    };
    const std::string name = group_.name;
    options.on_member_dead = [name](uint32_t index, const std::string& reason) {
      spdlog::error(
          "CP group {}: member {} is gone and its ranks are unavailable "
          "(loads miss, backups skip) until it rejoins: {}",
          name, index, reason);
    };
    absl::StatusOr<std::unique_ptr<group::GroupLeader>> leader =
        group::GroupLeader::Create(std::move(options), engine, routing_);
    if (!leader.ok()) return leader.status();
    leader_ = *std::move(leader);
    kv_ = std::make_unique<group::InMemoryRendezvousKv>();
    joins_ = std::make_unique<LeaderJoinHandler>(
        group_.name, member_, leader_.get(),
        [this, timeout](const std::string& prefix)
            -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
          KvGlooStore store(kv_.get(), kConnectTimeout);
          return ConnectLink(&store, prefix, /*rank=*/0, device_, timeout);
        },
        [this](const std::string& prefix) { ReclaimLinkKeys(prefix); });
    service_ = std::make_unique<service::CpGroupService>(
        group_.name, joins_.get(), kv_.get(), members);
    spdlog::info("CP group {}: leading C={} with pools for ranks [{}] as '{}'",
                 group_.name, config_.cp_size,
                 absl::StrJoin(engine_options_.pool_ranks, ","), member_);
    return absl::OkStatus();
  }
  const RankPools* pools = &engine->pools();
  const std::vector<Rank> ranks = engine->layout().served_ranks();
  geometry_bytes_ = group::EncodeGroupGeometry(geometry);
  follower_ = std::make_unique<group::GroupFollower>(
      group::GroupFollowerOptions{
          .group_name = group_.name,
          .cp_size = config_.cp_size,
          .leader = group_.leader,
          .scope = {.ranks = ranks,
                    .num_steps = engine->geometry().NumSteps(),
                    .device_pages_per_rank = static_cast<int64_t>(
                        config_.device_pages_per_rank),
                    .host_pages_per_rank =
                        static_cast<int64_t>(config_.host_pages_per_rank)},
          .heartbeat_interval = interval,
          .heartbeat_timeout = timeout,
          .events = hub},
      [backend, pools](TransferListener* listener) {
        return backend->CreateTransferEngine(pools, listener);
      },
      [this](const absl::Status& cause) { Fatal(cause); });
  spdlog::info("CP group {}: following the leader at {} with ranks [{}] as "
               "'{}'",
               group_.name, group_.leader, absl::StrJoin(ranks, ","), member_);
  return absl::OkStatus();
}

void CpGroupRuntime::ReclaimLinkKeys(const std::string& prefix) {
  // The leader's end returning from Connect does not mean the member's end
  // has read the leader's keys yet (a TCP connect completes before the
  // peer's rendezvous does), so a link's keys are kept until no end of it
  // can still be connecting: longer than either end's connect may last.
  const absl::Time now = absl::Now();
  std::vector<std::string> expired;
  {
    MutexLock lock(&mu_);
    done_links_.push_back({prefix, now});
    while (!done_links_.empty() &&
           now - done_links_.front().second > kLinkKeysGrace) {
      expired.push_back(std::move(done_links_.front().first));
      done_links_.pop_front();
    }
  }
  for (const std::string& old : expired) kv_->EraseUnderPrefix(old);
}

absl::Status CpGroupRuntime::Start(grpc::Server* server, int tcp_port) {
  if (leader_role_) {
    std::string advertise = group_.advertise;
    if (advertise.empty()) {
      const std::string& listen = config_.listen_tcp;
      advertise = absl::StrCat(listen.substr(0, listen.rfind(':')), ":",
                               tcp_port);
    }
    MutexLock lock(&mu_);
    advertise_ = advertise;
    spdlog::info("CP group {}: leading on {}", group_.name, advertise);
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      LeaderCredentials(config_);
  if (!credentials.ok()) return credentials.status();
  leader_stub_ = std::shared_ptr<internal::v1::CpGroup::Stub>(
      internal::v1::CpGroup::NewStub(
          grpc::CreateChannel(group_.leader, *credentials)));
  joiner_ = std::thread([this] { JoinLoop(); });
  return absl::OkStatus();
}

void CpGroupRuntime::JoinLoop() {
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(group_.join_timeout_ms);
  absl::Duration backoff = absl::Milliseconds(50);
  int attempts = 0;
  while (true) {
    ++attempts;
    const absl::Status joined = JoinOnce();
    if (joined.ok()) return;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (absl::IsFailedPrecondition(joined) ||
        absl::IsInvalidArgument(joined) ||
        absl::IsPermissionDenied(joined)) {
      Fatal(absl::FailedPreconditionError(absl::StrCat(
          "CP group ", group_.name, ": the leader at ", group_.leader,
          " refused this member: ", joined.message())));
      return;
    }
    if (absl::Now() + backoff > deadline) {
      Fatal(absl::UnavailableError(absl::StrCat(
          "CP group ", group_.name, ": could not join the leader at ",
          group_.leader, " within ",
          absl::FormatDuration(absl::Milliseconds(group_.join_timeout_ms)),
          " (", attempts, " attempts); last: ", joined.ToString())));
      return;
    }
    if (attempts == 1 || attempts % 20 == 0) {
      spdlog::warn("CP group {}: joining the leader at {} (attempt {}): {}",
                   group_.name, group_.leader, attempts, joined.ToString());
    }
    MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + backoff;
    while (!stopping_ && absl::Now() < until) {
      stop_cv_.WaitWithTimeout(&mu_, until - absl::Now());
    }
    if (stopping_) return;
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

absl::Status CpGroupRuntime::JoinOnce() {
  internal::v1::JoinRequest request;
  request.set_group(group_.name);
  request.set_member_name(member_);
  request.set_geometry(geometry_bytes_);
  request.set_advertise_address(config_.listen_tcp);
  internal::v1::JoinResponse reply;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kJoinRpcTimeout));
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    join_context_ = &context;
  }
  const grpc::Status rpc = leader_stub_->Join(&context, request, &reply);
  {
    MutexLock lock(&mu_);
    join_context_ = nullptr;
  }
  if (!rpc.ok()) return FromGrpcStatus(rpc);
  GrpcRendezvousStore store(leader_stub_, {.timeout = kConnectTimeout});
  absl::StatusOr<std::unique_ptr<comm::Communicator>> link =
      ConnectLink(&store, reply.rendezvous_prefix(), /*rank=*/1, device_,
                  absl::Milliseconds(group_.timeout_ms));
  if (!link.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "admitted as member ", reply.member_index(), " (epoch ", reply.epoch(),
        ") but the link did not connect: ", link.status().ToString()));
  }
  {
    MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
  }
  if (absl::Status run = follower_->Run(*std::move(link), reply.epoch(),
                                        reply.member_index());
      !run.ok()) {
    return run;
  }
  spdlog::info("CP group {}: joined the leader '{}' at {} as member {} "
               "(epoch {})",
               group_.name, reply.leader_name(), group_.leader,
               reply.member_index(), reply.epoch());
  return absl::OkStatus();
}

void CpGroupRuntime::Fatal(const absl::Status& cause) {
  {
    MutexLock lock(&mu_);
    if (fatal_ || stopping_) return;
    fatal_ = true;
  }
  spdlog::error("{}; this daemon stops (exit 1) so that the group restarts",
                std::string(cause.message()));
  if (on_fatal_) on_fatal_(cause);
}

std::optional<group::GroupStatus> CpGroupRuntime::Status() const {
  if (leader_ != nullptr) {
    group::GroupStatus status = leader_->Status();
    if (!status.members.empty()) status.members[0].name = member_;
    return status;
  }
  if (follower_ == nullptr) return std::nullopt;
  group::GroupStatus status = follower_->Status();
  if (status.members.empty()) {
    status.members.push_back(group::GroupMemberStatus{
        .index = 0, .name = group_.leader, .live = false});
  }
  return status;
}

absl::Status CpGroupRuntime::ForwardLayerStored(
    const std::string& ns, Rank rank, uint32_t step,
    absl::Span<const uint64_t> ops,
    absl::Span<const RankFence> /*fences*/) const {
  if (follower_ == nullptr) {
    return absl::UnavailableError(
        "this daemon is the CP group leader: acks stay local");
  }
  return follower_->ForwardLayerStored(ns, rank, step, ops);
}

std::string CpGroupRuntime::LeaderAddress() const {
  if (!leader_role_) return group_.leader;
  MutexLock lock(&mu_);
  return advertise_;
}

void CpGroupRuntime::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    stop_cv_.SignalAll();
    if (join_context_ != nullptr) join_context_->TryCancel();
  }
  if (joiner_.joinable()) joiner_.join();
  if (follower_ != nullptr) follower_->Stop();
  if (joins_ != nullptr) joins_->Shutdown();
  if (kv_ != nullptr) kv_->Shutdown();
  // The admission thread is joined when joins_ is destroyed (the service
  // may still hold it until the server is gone); an admission it is still
  // running is refused by the stopped leader.
  if (leader_ != nullptr) leader_->Stop();
  if (forwarder_ != nullptr) forwarder_->Stop();
}

}  // namespace hicache
