#include "bench/cp_group_processes.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_client.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/grpcpp.h"
#include "hicache/v1/hicache.grpc.pb.h"

extern char** environ;

namespace hicache::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;

double Micros(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

std::string FindDaemon(const ProcessBenchOptions& o) {
  if (!o.daemon.empty()) return o.daemon;
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(absl::StrCat(dir, "/hicache/daemon/hicached"));
  }
  if (const char* dir = std::getenv("TEST_SRCDIR")) {
    candidates.push_back(absl::StrCat(dir, "/hicache/daemon/hicached"));
  }
  candidates.push_back(
      absl::StrCat(o.argv0, ".runfiles/hicache/daemon/hicached"));
  candidates.push_back("daemon/hicached");  // bazel run's working directory.
  for (const std::string& path : candidates) {
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

std::shared_ptr<v1::HiCache::Stub> StubFor(const std::string& socket) {
  auto channel = client::HiCacheClient::NewChannel(client::UnixTarget(socket));
  if (!channel.ok()) return nullptr;
  return v1::HiCache::NewStub(*channel);
}

absl::StatusOr<v1::GetStatsResponse> GetStats(v1::HiCache::Stub& stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::GetStatsResponse stats;
  absl::Status s =
      FromGrpc(stub.GetStats(&ctx, v1::GetStatsRequest(), &stats), "GetStats");
  if (!s.ok()) return s;
  return stats;
}

// One hicached process; stopped (SIGTERM, SIGKILL after 10 s) and reaped by
// the destructor.
class DaemonProcess {
 public:
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Spawn(
      const std::string& binary, const std::string& dir,
      const std::string& name, std::vector<std::string> args) {
    auto d = std::unique_ptr<DaemonProcess>(new DaemonProcess());
    d->name_ = name;
    d->socket_ = absl::StrCat(dir, "/", name, ".sock");
    d->log_ = absl::StrCat(dir, "/", name, ".log");
    args.insert(args.begin(), {binary, "--socket=" + d->socket_});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, d->log_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int rc = posix_spawn(&d->pid_, binary.c_str(), &actions, nullptr,
                               argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      d->pid_ = -1;
      return absl::InternalError(
          absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
    }
    return d;
  }

  ~DaemonProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        break;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  bool Running() {
    if (pid_ <= 0 || exited_) return false;
    if (waitpid(pid_, nullptr, WNOHANG) != 0) {
      exited_ = true;
      pid_ = -1;
      return false;
    }
    return true;
  }

  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream out;
    out << in.rdbuf();
    return out.str();
  }
  std::string Tail() const {
    const std::string log = Log();
    return log.size() > 3000 ? log.substr(log.size() - 3000) : log;
  }

  // Waits (polling GetStats with short pauses: there is no event to wait
  // on for a process coming up) until the daemon answers on its socket.
  absl::Status WaitServing(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Status last = absl::UnavailableError("not asked yet");
    while (absl::Now() < deadline) {
      if (!Running()) {
        return absl::FailedPreconditionError(
            absl::StrCat(name_, " exited before serving:\n", Tail()));
      }
      auto stub = StubFor(socket_);
      if (stub != nullptr) {
        auto stats = GetStats(*stub);
        if (stats.ok()) {
          stub_ = std::move(stub);
          return absl::OkStatus();
        }
        last = stats.status();
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        name_, " did not serve within ", absl::FormatDuration(timeout),
        " (last: ", last.ToString(), "):\n", Tail()));
  }

  const std::string& name() const { return name_; }
  const std::string& socket() const { return socket_; }
  v1::HiCache::Stub& stub() { return *stub_; }
  const std::shared_ptr<v1::HiCache::Stub>& shared_stub() { return stub_; }

 private:
  DaemonProcess() = default;
  std::string name_, socket_, log_;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::shared_ptr<v1::HiCache::Stub> stub_;
};

// A scheduler on one daemon: a session and its BackupSession stream.
struct Scheduler {
  std::shared_ptr<v1::HiCache::Stub> stub;
  std::unique_ptr<client::Session> session;
  std::unique_ptr<client::BackupStream> stream;

  static absl::StatusOr<Scheduler> Open(DaemonProcess& daemon) {
    Scheduler s;
    s.stub = daemon.shared_stub();
    auto session = client::Session::Open(s.stub, "cp-group-bench",
                                         v1::ROLE_SCHEDULER, 0, "",
                                         absl::Seconds(30), absl::Seconds(20));
    if (!session.ok()) return session.status();
    s.session = *std::move(session);
    auto stream = s.session->OpenBackupStream();
    if (!stream.ok()) return stream.status();
    s.stream = *std::move(stream);
    return s;
  }
};

std::vector<int32_t> KeyTokens(int64_t key, size_t n) {
  std::vector<int32_t> tokens(n);
  tokens[0] = static_cast<int32_t>(key % 1000000000) + 1;
  for (size_t i = 1; i < n; ++i) tokens[i] = static_cast<int32_t>(i);
  return tokens;
}

struct Timed {
  double final_step_to_commit = 0;
  double prepare_to_commit = 0;
};

absl::StatusOr<Timed> OneBackup(Scheduler& s, const ProcessBenchOptions& o,
                                uint32_t num_steps, int64_t key) {
  const int ranks = 2;
  v1::AllocateItem item;
  item.set_num_pages(o.pages);
  for (int i = 0; i < o.pages; ++i) item.add_owners(i % ranks);
  auto allocation = s.session->Allocate({item});
  if (!allocation.ok()) return allocation.status();
  v1::BackupSpec spec;
  *spec.mutable_pages() = allocation->allocations(0).pages();
  const std::vector<int32_t> tokens =
      KeyTokens(key, static_cast<size_t>(o.pages) * o.page_size);
  spec.set_logical_tokens(static_cast<int64_t>(tokens.size()));

  const SteadyClock::time_point start = SteadyClock::now();
  auto ids = s.stream->Prepare({spec});
  if (!ids.ok()) return ids.status();
  const uint64_t id = ids->at(0);
  if (id == 0) return absl::UnavailableError("backup skipped at prepare");
  const uint32_t last = num_steps - 1;
  for (uint32_t step = 0; step < last; ++step) {
    if (absl::Status st = s.stream->LayerStored({id}, step); !st.ok()) {
      return st;
    }
  }
  // The earlier layers' copies are done, as a forward pass's compute
  // spaces layers out.
  if (absl::Status st = s.stream->WaitSteps(id, ranks * last); !st.ok()) {
    return st;
  }
  v1::InsertRequest insert;
  v1::InsertItem* insert_item = insert.add_items();
  insert_item->set_tokens(client::PackTokens(tokens));
  *insert_item->mutable_pages() = spec.pages();
  insert_item->set_backup_id(id);
  auto inserted = s.session->Insert(insert);
  if (!inserted.ok()) return inserted.status();
  if (inserted->results_size() != 1 ||
      !inserted->results(0).backup_attached() ||
      inserted->results(0).uncached_pages_size() != 0) {
    return absl::InternalError(absl::StrCat(
        "key ", key, " not cached whole with its backup attached: ",
        inserted->ShortDebugString()));
  }
  const SteadyClock::time_point final_step = SteadyClock::now();
  if (absl::Status st = s.stream->LayerStored({id}, last); !st.ok()) return st;
  auto node = s.stream->WaitCommitted(id);
  const SteadyClock::time_point committed = SteadyClock::now();
  if (!node.ok()) return node.status();
  if (auto errors = s.stream->TakeErrors(); !errors.empty()) {
    return absl::InternalError(
        absl::StrCat("stream error: ", errors[0].ShortDebugString()));
  }
  s.stream->ForgetEnded();
  s.stream->ClearBuffered();
  // Room for the next key (untimed).
  v1::EvictRequest evict;
  for (int r = 0; r < ranks; ++r) {
    evict.add_device_pages_per_lane(int64_t{1} << 40);
    evict.add_host_pages_per_rank(int64_t{1} << 40);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::EvictResponse evicted;
  if (absl::Status st = FromGrpc(s.stub->Evict(&ctx, evict, &evicted), "Evict");
      !st.ok()) {
    return st;
  }
  return Timed{.final_step_to_commit = Micros(final_step, committed),
               .prepare_to_commit = Micros(start, committed)};
}

absl::Status TreeCalls(Scheduler& s, const ProcessBenchOptions& o, int64_t key,
                       double* match_us, double* allocate_us) {
  const std::vector<int32_t> tokens =
      KeyTokens(key, static_cast<size_t>(o.pages) * o.page_size);
  SteadyClock::time_point start = SteadyClock::now();
  auto match = s.session->MatchPrefix({tokens});
  *match_us = Micros(start, SteadyClock::now());
  if (!match.ok()) return match.status();
  v1::AllocateItem item;
  item.set_num_pages(o.pages);
  start = SteadyClock::now();
  auto allocation = s.session->Allocate({item});
  *allocate_us = Micros(start, SteadyClock::now());
  if (!allocation.ok()) return allocation.status();
  const auto& pages = allocation->allocations(0).pages();
  return s.session->Free(std::vector<int64_t>(pages.begin(), pages.end()));
}

}  // namespace

absl::StatusOr<ProcessBenchResult> RunProcessBench(
    const ProcessBenchOptions& o) {
  if (o.pages < 2) return absl::InvalidArgumentError("--pages must be >= 2");
  const std::string binary = FindDaemon(o);
  if (binary.empty()) {
    return absl::NotFoundError(
        "hicached not found in the runfiles; pass --daemon=PATH");
  }
  char pattern[] = "/tmp/hicache-cpgb-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp");
  const std::string dir = pattern;
  const int64_t device_pages = std::max<int64_t>(256, 4 * o.pages);
  const std::string tag = absl::StrCat("cpgb", getpid());
  auto common = [&](const std::string& who) {
    return std::vector<std::string>{
        "--instance=" + tag + who,
        "--cp_size=2",
        absl::StrCat("--page_size=", o.page_size),
        "--kv_preset=" + o.kv_preset,
        absl::StrCat("--device_pages_per_rank=", device_pages),
        absl::StrCat("--host_pages_per_rank=", 2 * device_pages),
        "--log_level=info",
    };
  };
  auto group_flags = [&](std::vector<std::string> args,
                         const std::string& member) {
    args.push_back("--cp_group=bench");
    args.push_back("--cp_group_member=" + member);
    args.push_back("--cp_group_bind=127.0.0.1");
    if (o.heartbeat_ms > 0) {
      args.push_back(absl::StrCat("--cp_group_heartbeat_ms=", o.heartbeat_ms));
    }
    if (o.timeout_ms > 0) {
      args.push_back(absl::StrCat("--cp_group_timeout_ms=", o.timeout_ms));
    }
    return args;
  };

  ProcessBenchResult result;
  absl::Status status = [&]() -> absl::Status {
    // Start all three, then wait: their start-ups overlap.
    auto single = DaemonProcess::Spawn(binary, dir, "single", common("s"));
    if (!single.ok()) return single.status();
    std::vector<std::string> leader_args = group_flags(common("l"), "leader");
    leader_args.push_back("--ranks=0");
    leader_args.push_back("--listen_tcp=127.0.0.1:0");
    leader_args.push_back("--insecure_tcp_for_testing");
    auto leader = DaemonProcess::Spawn(binary, dir, "leader", leader_args);
    if (!leader.ok()) return leader.status();
    for (DaemonProcess* d : {single->get(), leader->get()}) {
      if (absl::Status s = d->WaitServing(absl::Seconds(30)); !s.ok()) return s;
    }
    // The leader's TCP target: GetStats, else its log line.
    std::string target;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (target.empty() && absl::Now() < deadline) {
      auto stats = GetStats((*leader)->stub());
      if (stats.ok()) target = stats->cp_group().leader_address();
      if (target.empty()) {
        const std::string log = (*leader)->Log();
        const std::string marker = "CP group bench: leading on ";
        if (size_t at = log.find(marker); at != std::string::npos) {
          const size_t begin = at + marker.size();
          const size_t end = log.find_first_of(" \n\r,;)", begin);
          target = log.substr(begin, end == std::string::npos
                                         ? std::string::npos
                                         : end - begin);
        }
      }
      if (target.empty()) absl::SleepFor(absl::Milliseconds(10));
    }
    if (target.empty()) {
      return absl::DeadlineExceededError(
          absl::StrCat("the leader's target is unknown:\n", (*leader)->Tail()));
    }
    std::vector<std::string> follower_args =
        group_flags(common("f"), "follower");
    follower_args.push_back("--ranks=1");
    follower_args.push_back("--cp_group_leader=" + target);
    // The leader's TCP listener is plain (tests and benches only).
    follower_args.push_back("--insecure_tcp_for_testing");
    auto follower = DaemonProcess::Spawn(binary, dir, "follower", follower_args);
    if (!follower.ok()) return follower.status();
    if (absl::Status s = (*follower)->WaitServing(absl::Seconds(30)); !s.ok()) {
      return s;
    }
    std::string state;
    while (absl::Now() < deadline + absl::Seconds(30)) {
      auto stats = GetStats((*leader)->stub());
      if (stats.ok()) state = stats->cp_group().state();
      if (state == "formed") break;
      if (!(*follower)->Running()) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (state != "formed") {
      return absl::DeadlineExceededError(absl::StrCat(
          "the group did not form (state \"", state, "\"); leader:\n",
          (*leader)->Tail(), "\nfollower:\n", (*follower)->Tail()));
    }

    auto single_scheduler = Scheduler::Open(**single);
    if (!single_scheduler.ok()) return single_scheduler.status();
    auto group_scheduler = Scheduler::Open(**leader);
    if (!group_scheduler.ok()) return group_scheduler.status();
    auto layout = single_scheduler->session->GetLayout();
    if (!layout.ok()) return layout.status();
    const uint32_t steps = layout->num_steps();
    if (steps == 0) return absl::InternalError("the layout has no steps");
    result.num_steps = steps;
    Scheduler* schedulers[2] = {&*single_scheduler, &*group_scheduler};
    int64_t key = 0;
    for (int i = 0; i < o.warmup + o.iterations; ++i) {
      for (int k = 0; k < 2; ++k) {
        const int r = (i % 2 == 0) ? k : 1 - k;
        auto timed = OneBackup(*schedulers[r], o, steps, ++key);
        if (!timed.ok()) {
          return absl::Status(
              timed.status().code(),
              absl::StrCat(r == 0 ? "single" : "group", " backup ", i, ": ",
                           timed.status().message()));
        }
        if (i < o.warmup) continue;
        result.final_step_to_commit[r].push_back(timed->final_step_to_commit);
        result.prepare_to_commit[r].push_back(timed->prepare_to_commit);
      }
    }
    for (int i = 0; i < o.tree_calls; ++i) {
      for (int k = 0; k < 2; ++k) {
        const int r = (i % 2 == 0) ? k : 1 - k;
        double match_us = 0, allocate_us = 0;
        if (absl::Status s =
                TreeCalls(*schedulers[r], o, ++key, &match_us, &allocate_us);
            !s.ok()) {
          return s;
        }
        result.match[r].push_back(match_us);
        result.allocate[r].push_back(allocate_us);
      }
    }
    auto stats = GetStats((*leader)->stub());
    if (!stats.ok()) return stats.status();
    result.group_state = stats->cp_group().state();
    result.group_deaths = stats->cp_group().deaths();
    for (Scheduler* s : schedulers) {
      (void)s->stream->Close();
      (void)s->session->Close();
    }
    return absl::OkStatus();
  }();
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), "\n(logs kept in ",
                                     dir, ")"));
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return result;
}

}  // namespace hicache::bench
