#include "bench/cp_group_rig.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <future>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/backend/cpu/cpu_transfer_engine.h"
#include "daemon/comm/gloo_communicator.h"
#include "daemon/core/mutex.h"
#include "daemon/group/group_follower.h"
#include "daemon/group/group_geometry.h"
#include "daemon/group/group_leader.h"
#include "daemon/group/routing_transfer_engine.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/rank_pools.h"
#include "daemon/pool/shm_pool.h"
#include "gloo/rendezvous/file_store.h"

namespace hicache::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Micros(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// Sits between the transfer engine and the engine (TransferListener) and
// listens to the engine (EngineListener): stamps rank 0's final ack, its
// final step event and the commit of the one backup it is armed for.
class CommitProbe final : public TransferListener, public EngineListener {
 public:
  struct Marks {
    SteadyClock::time_point ack;     // rank 0's final StepDone arrived
    SteadyClock::time_point step;    // kBackupStep(op, 0, last)
    SteadyClock::time_point commit;  // kCommitted(op)
  };

  // The engine. Set once, inside EngineOptions::wrap_transfer (before any
  // copy runs).
  void set_downstream(TransferListener* downstream) {
    downstream_ = downstream;
  }

  // Watches backup `op` from now on. Call before its first LayerStored.
  void Arm(uint64_t op, uint32_t last_step) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    op_ = op;
    last_step_ = last_step;
    has_ack_ = has_step_ = done_ = committed_ = false;
  }

  // Waits for the armed backup's commit (or rollback).
  absl::StatusOr<Marks> Await(absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_) {
    const absl::Time deadline = absl::Now() + timeout;
    MutexLock lock(&mu_);
    while (!done_) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration() || cv_.WaitWithTimeout(&mu_, left)) {
        if (done_) break;
        return absl::DeadlineExceededError(absl::StrCat(
            "backup ", op_, " not committed within ",
            absl::FormatDuration(timeout)));
      }
    }
    if (!committed_) {
      return absl::AbortedError(
          absl::StrCat("backup ", op_, " rolled back instead of committing"));
    }
    if (!has_ack_ || !has_step_) {
      return absl::InternalError(absl::StrCat(
          "backup ", op_, " committed without rank 0's final ",
          has_ack_ ? "step event" : "ack", " being seen"));
    }
    return marks_;
  }

  void OnStepDone(StepDone done) override ABSL_LOCKS_EXCLUDED(mu_) {
    const SteadyClock::time_point now = SteadyClock::now();
    if (done.rank == 0 && done.direction == TransferDirection::kDeviceToHost) {
      MutexLock lock(&mu_);
      if (done.op_id == op_ && done.step == last_step_ && !has_ack_) {
        marks_.ack = now;
        has_ack_ = true;
      }
    }
    downstream_->OnStepDone(std::move(done));
  }

  void OnOpEvent(const OpEvent& e) override ABSL_LOCKS_EXCLUDED(mu_) {
    const SteadyClock::time_point now = SteadyClock::now();
    MutexLock lock(&mu_);
    if (e.op != op_) return;
    switch (e.type) {
      case OpEvent::Type::kBackupStep:
        if (e.rank == 0 && e.step == last_step_ && !has_step_) {
          marks_.step = now;
          has_step_ = true;
        }
        break;
      case OpEvent::Type::kCommitted:
      case OpEvent::Type::kRolledBack:
        if (done_) return;
        if (e.type == OpEvent::Type::kCommitted) {
          marks_.commit = now;
          committed_ = true;
        }
        done_ = true;
        cv_.SignalAll();
        break;
      default:
        break;
    }
  }

 private:
  TransferListener* downstream_ = nullptr;
  Mutex mu_;
  CondVar cv_;
  uint64_t op_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t last_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_ack_ ABSL_GUARDED_BY(mu_) = false;
  bool has_step_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  Marks marks_ ABSL_GUARDED_BY(mu_);
};

EngineOptions BaseEngineOptions(const CommitRigOptions& o) {
  EngineOptions e;
  e.page_size = o.page_size;
  e.cp_size = 2;
  e.kv_preset = o.kv_preset;
  e.device_pages_per_rank = o.device_pages_per_rank;
  e.host_pages_per_rank = o.host_pages_per_rank;
  e.transfer_workers = o.transfer_workers;
  // Every backup is explicit (PrepareBackups): no write-through from Match.
  e.write_policy = WritePolicy::kWriteThroughSelective;
  e.write_through_threshold = 1000000;
  return e;
}

absl::Status CheckOptions(const CommitRigOptions& o) {
  if (o.pages_per_backup < 2) {
    return absl::InvalidArgumentError(
        "pages_per_backup must be at least 2 (one page on each rank)");
  }
  if (o.pages_per_backup > o.device_pages_per_rank ||
      o.pages_per_backup > o.host_pages_per_rank) {
    return absl::InvalidArgumentError(
        "pages_per_backup exceeds the pools (device/host pages per rank)");
  }
  return absl::OkStatus();
}

}  // namespace

struct CommitRig::State {
  CommitRigOptions options;
  std::string name;
  std::unique_ptr<CommitProbe> probe = std::make_unique<CommitProbe>();
  // Group only: the follower daemon and the link's rendezvous.
  std::string store_dir;
  std::unique_ptr<ShmPoolBackend> follower_backend;
  std::unique_ptr<RankPools> follower_pools;
  std::unique_ptr<group::GroupFollower> follower;
  std::atomic<int> follower_fatals{0};
  std::atomic<int> member_deaths{0};
  group::RoutingTransferEngine* routing = nullptr;  // Owned by the engine.
  std::unique_ptr<HiCacheEngine> engine;
  std::unique_ptr<group::GroupLeader> leader;
  std::vector<Rank> owners;  // Zigzag: 0, 1, 0, 1, ...

  ~State() {
    leader.reset();  // Bye to the follower; before the engine (routing).
    follower.reset();  // Its copies use its pools.
    follower_pools.reset();
    engine.reset();  // Calls the probe until destroyed.
    if (!store_dir.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(store_dir, ignored);
    }
  }
};

CommitRig::CommitRig(std::unique_ptr<State> state) : state_(std::move(state)) {
  for (int i = 0; i < state_->options.pages_per_backup; ++i) {
    state_->owners.push_back(static_cast<Rank>(i % 2));
  }
}
CommitRig::~CommitRig() = default;

HiCacheEngine& CommitRig::engine() { return *state_->engine; }
const std::string& CommitRig::name() const { return state_->name; }
uint32_t CommitRig::num_steps() const {
  return state_->engine->geometry().NumSteps();
}

absl::StatusOr<std::unique_ptr<CommitRig>> CommitRig::Baseline(
    const CommitRigOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  auto state = std::make_unique<State>();
  state->options = options;
  state->name = "baseline";
  EngineOptions eo = BaseEngineOptions(options);
  CommitProbe* probe = state->probe.get();
  eo.wrap_transfer = [probe](TransferListener* listener,
                             const TransferEngineFactory& backend) {
    probe->set_downstream(listener);
    return backend(probe);
  };
  auto engine = HiCacheEngine::Create(eo);
  if (!engine.ok()) return engine.status();
  state->engine = *std::move(engine);
  state->engine->SetListener(probe);
  return std::unique_ptr<CommitRig>(new CommitRig(std::move(state)));
}

absl::StatusOr<std::unique_ptr<CommitRig>> CommitRig::Group(
    const CommitRigOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  auto state = std::make_unique<State>();
  state->options = options;
  state->name = "group";
  State* raw = state.get();

  // The leader daemon: rank 0's pools, rank 1 routed to the follower.
  EngineOptions eo = BaseEngineOptions(options);
  eo.pool_ranks = {0};
  const EngineOptions plain = eo;
  CommitProbe* probe = state->probe.get();
  eo.wrap_transfer = [probe, raw](TransferListener* listener,
                                  const TransferEngineFactory& backend)
      -> std::unique_ptr<TransferEngine> {
    probe->set_downstream(listener);
    auto routing = std::make_unique<group::RoutingTransferEngine>(
        probe, backend(probe), std::vector<Rank>{0});
    raw->routing = routing.get();
    return routing;
  };
  auto engine = HiCacheEngine::Create(eo);
  if (!engine.ok()) return engine.status();
  state->engine = *std::move(engine);
  state->engine->SetListener(probe);
  if (state->routing == nullptr) {
    return absl::InternalError("the engine did not install the routing engine");
  }
  const KvGeometry& geometry = state->engine->geometry();
  group::GroupLeaderOptions leader_options{
      .group_name = "bench",
      .cp_size = 2,
      .geometry = group::GroupGeometryFrom(plain, geometry),
      .heartbeat_interval = options.heartbeat_interval,
      .heartbeat_timeout = options.heartbeat_timeout};
  leader_options.on_member_dead = [raw](uint32_t, const std::string&) {
    ++raw->member_deaths;
  };
  auto leader = group::GroupLeader::Create(std::move(leader_options),
                                           state->engine.get(),
                                           state->routing);
  if (!leader.ok()) return leader.status();
  state->leader = *std::move(leader);

  // The follower daemon: rank 1's pools and copy engine.
  state->follower_backend = std::make_unique<ShmPoolBackend>(
      absl::StrCat("/hicache-cpgb-", getpid(), "-",
                   reinterpret_cast<uintptr_t>(raw)));
  auto layout = CpLayout::Create(options.page_size, 2, {1});
  if (!layout.ok()) return layout.status();
  auto pools = RankPools::Create(
      *layout, geometry,
      {.device_pages_per_rank = options.device_pages_per_rank,
       .host_pages_per_rank = options.host_pages_per_rank,
       .host_layout = eo.host_layout},
      *state->follower_backend);
  if (!pools.ok()) return pools.status();
  state->follower_pools = *std::move(pools);
  const RankPools* follower_pools = state->follower_pools.get();
  const int workers = options.transfer_workers;
  state->follower = std::make_unique<group::GroupFollower>(
      group::GroupFollowerOptions{
          .group_name = "bench",
          .cp_size = 2,
          .leader = "leader in this process",
          .scope = {.ranks = {1},
                    .num_steps = geometry.NumSteps(),
                    .device_pages_per_rank = options.device_pages_per_rank,
                    .host_pages_per_rank = options.host_pages_per_rank},
          .heartbeat_interval = options.heartbeat_interval,
          .heartbeat_timeout = options.heartbeat_timeout},
      [follower_pools, workers](TransferListener* listener) {
        return std::make_unique<CpuTransferEngine>(follower_pools, listener,
                                                   workers);
      },
      [raw](const absl::Status&) { ++raw->follower_fatals; });

  // The link: Gloo TCP on 127.0.0.1, one device per daemon, a FileStore
  // per end over one temporary directory.
  char pattern[] = "/tmp/hicache-cpg-bench-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    return absl::InternalError("mkdtemp failed for the Gloo rendezvous");
  }
  state->store_dir = pattern;
  std::unique_ptr<gloo::rendezvous::FileStore> stores[2];
  try {
    for (auto& store : stores) {
      store = std::make_unique<gloo::rendezvous::FileStore>(state->store_dir);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("Gloo FileStore: ", e.what()));
  }
  comm::GlooLinkOptions link_options[2];
  for (int rank = 0; rank < 2; ++rank) {
    auto device = comm::GlooCommunicator::CreateTcpDevice("127.0.0.1");
    if (!device.ok()) return device.status();
    link_options[rank].store = stores[rank].get();
    link_options[rank].key_prefix = "cp/bench/1/follower";
    link_options[rank].rank = rank;
    link_options[rank].device = *std::move(device);
    link_options[rank].connect_timeout = absl::Seconds(30);
    // Liveness is the heartbeats' job; this only bounds a stuck message.
    link_options[rank].receive_timeout = absl::Seconds(30);
    link_options[rank].peer_name = rank == 0 ? "follower" : "leader";
  }
  auto follower_end = std::async(std::launch::async, [&link_options] {
    return comm::GlooCommunicator::Connect(link_options[1]);
  });
  auto leader_end = comm::GlooCommunicator::Connect(link_options[0]);
  auto follower_link = follower_end.get();
  if (!leader_end.ok()) return leader_end.status();
  if (!follower_link.ok()) return follower_link.status();

  EngineOptions follower_engine_options = plain;
  follower_engine_options.pool_ranks = {1};
  auto admission = state->leader->Admit(
      "follower", group::GroupGeometryFrom(follower_engine_options, geometry),
      *std::move(leader_end));
  if (!admission.ok()) return admission.status();
  if (absl::Status ran = state->follower->Run(*std::move(follower_link),
                                              admission->epoch,
                                              admission->member_index);
      !ran.ok()) {
    return ran;
  }
  if (!state->engine->UnavailableLanes().empty()) {
    return absl::InternalError("rank 1 still unavailable after admission");
  }
  return std::unique_ptr<CommitRig>(new CommitRig(std::move(state)));
}

namespace {

std::vector<int32_t> KeyTokens(int64_t key, size_t n) {
  std::vector<int32_t> tokens(n);
  // A distinct first token per key: distinct keys never share a node.
  tokens[0] = static_cast<int32_t>(key % 1000000000) + 1;
  for (size_t i = 1; i < n; ++i) tokens[i] = static_cast<int32_t>(i);
  return tokens;
}

}  // namespace

absl::StatusOr<BackupTiming> CommitRig::Backup(int64_t key) {
  State& s = *state_;
  HiCacheEngine& e = *s.engine;
  const uint32_t last = e.geometry().NumSteps() - 1;
  const std::vector<int32_t> tokens = KeyTokens(
      key, static_cast<size_t>(s.options.pages_per_backup) * s.options.page_size);
  auto pages = e.AllocateWithOwners(s.owners);
  if (!pages.ok()) return pages.status();
  // On an error before Insert the pages are still ours.
  auto fail_before_insert = [&](uint64_t op, absl::Status why) {
    if (op != 0) (void)e.RollbackBackup(op);
    e.WaitForTransfers();
    if (absl::Status freed = e.Free(*pages); !freed.ok()) {
      return absl::Status(why.code(),
                          absl::StrCat(why.message(), "; freeing: ",
                                       freed.message()));
    }
    return why;
  };

  const SteadyClock::time_point start = SteadyClock::now();
  auto ops = e.PrepareBackups(
      {BackupSpec{*pages, static_cast<int64_t>(tokens.size())}});
  if (!ops.ok()) return fail_before_insert(0, ops.status());
  const uint64_t op = (*ops)[0];
  if (op == 0) {
    return fail_before_insert(
        0, absl::UnavailableError(absl::StrCat(
               s.name, ": backup skipped (a lane unavailable or no host room;"
                       " follower deaths ",
               s.member_deaths.load(), ")")));
  }
  s.probe->Arm(op, last);
  for (uint32_t step = 0; step < last; ++step) {
    if (absl::Status st = e.LayerStored({op}, step); !st.ok()) {
      return fail_before_insert(op, st);
    }
  }
  auto inserted = e.Insert("", tokens, *pages);
  if (!inserted.ok()) return fail_before_insert(op, inserted.status());
  if (inserted->deferred || !inserted->uncached_pages.empty() ||
      !inserted->duplicate_pages.empty()) {
    (void)e.RollbackBackup(op);
    return absl::InternalError(
        absl::StrCat(s.name, ": key ", key, " was not cached whole"));
  }
  if (absl::Status st = e.AttachBackup(op, inserted->node); !st.ok()) {
    (void)e.RollbackBackup(op);
    return st;
  }
  if (s.options.drain_before_last_step) e.WaitForTransfers();
  if (absl::Status st = e.LayerStored({op}, last); !st.ok()) {
    (void)e.RollbackBackup(op);
    return st;
  }
  auto marks = s.probe->Await(s.options.backup_timeout);
  if (!marks.ok()) {
    return absl::Status(marks.status().code(),
                        absl::StrCat(s.name, ": ", marks.status().message(),
                                     " (follower deaths ",
                                     s.member_deaths.load(), ")"));
  }
  // Room for the next key: drop this one from both tiers (untimed).
  const std::vector<int64_t> device(2, s.options.device_pages_per_rank);
  const std::vector<int64_t> host(2, s.options.host_pages_per_rank);
  if (auto evicted = e.EvictPages(device, host); !evicted.ok()) {
    return evicted.status();
  }
  return BackupTiming{
      .ack_to_commit_us = Micros(marks->ack, marks->commit),
      .step_to_commit_us = Micros(marks->step, marks->commit),
      .end_to_end_us = Micros(start, marks->commit)};
}

absl::StatusOr<double> CommitRig::TimeMatch(int64_t key) {
  State& s = *state_;
  const std::vector<int32_t> tokens = KeyTokens(
      key, static_cast<size_t>(s.options.pages_per_backup) * s.options.page_size);
  const SteadyClock::time_point start = SteadyClock::now();
  auto match = s.engine->Match("", tokens);
  const SteadyClock::time_point end = SteadyClock::now();
  if (!match.ok()) return match.status();
  return Micros(start, end);
}

absl::StatusOr<double> CommitRig::TimeAllocate() {
  State& s = *state_;
  const SteadyClock::time_point start = SteadyClock::now();
  auto pages = s.engine->Allocate(s.options.pages_per_backup);
  const SteadyClock::time_point end = SteadyClock::now();
  if (!pages.ok()) return pages.status();
  if (absl::Status freed = s.engine->Free(*pages); !freed.ok()) return freed;
  return Micros(start, end);
}

}  // namespace hicache::bench
