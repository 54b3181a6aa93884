// Two-process benchmark of a scheduler's request flow against a real
// hicached process (CPU backend), through client::Session.
//
//   bazel run --config=opt //bench:flow_bench --
//       [--socket=PATH]                  use a running daemon instead
//       [--page_size=64 --cp_size=1 --kv_preset=tiny ...]   spawned daemon
//       [--conversations=16 --turns=8 --system_tokens=1000 ...] workload
//       [--benchmark_filter=... --benchmark_repetitions=3]
//
// Without --socket it starts the real hicached (//daemon:hicached from its
// runfiles, or --daemon=PATH) as a separate process on a temporary socket
// and stops it (SIGTERM) at the end. With --socket the daemon's geometry is
// read from GetLayout; it needs room for the workload (every run uses fresh
// namespaces).
//
// BM_LayerStoredToStepDone/0: the scheduler prepares a backup of
//   --backup_pages pages and, per step s, sends layer_stored(s) on its
//   stream and times until step_done(s) of every served rank arrives.
// BM_LayerStoredToStepDone/1: the same, each rank's layer_stored sent by its
//   own worker session on its own stream (the scheduler's stream reads).
//   Counters: median_us, p99_us (per step). Goal: p50 <= 200 us.
// BM_ConversationFlow: a multi-turn conversation workload (a shared system
//   prompt; each turn's input is the previous turn's input and output plus
//   a new user message), every request run twice, side by side in one run,
//   in two namespaces with identical content:
//     admit_*:  Admit -> workers' layer_stored per layer -> Complete
//     legacy_*: MatchPrefix(lock) -> Allocate -> prepare (stream round trip)
//               -> workers' layer_stored per layer -> Insert -> Unlock -> Free
//   Counters per flow: median_us / p99_us per request, hit_rate (device hit
//   tokens / input tokens), attached (backups attached / prepared), loads
//   (host hits loaded back); ratio_median = legacy / admit. Complete caches
//   the request's input (the pages its backup covers); outputs are not
//   cached, so the next turn recomputes them.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/latencies.h"
#include "bench/spawned_daemon.h"
#include "benchmark/benchmark.h"
#include "client/cpp/endpoint.h"
#include "client/cpp/hicache_session.h"
#include "grpcpp/create_channel.h"

ABSL_FLAG(std::string, socket, "",
          "A running daemon's socket; empty: spawn hicached.");
ABSL_FLAG(std::string, daemon, "",
          "hicached binary to spawn; empty: //daemon:hicached's runfile.");
ABSL_FLAG(uint32_t, page_size, 64, "Spawned daemon: tokens per page.");
ABSL_FLAG(uint32_t, cp_size, 1, "Spawned daemon: CP ranks.");
ABSL_FLAG(std::string, kv_preset, "tiny", "Spawned daemon: KV preset.");
ABSL_FLAG(uint64_t, device_pages_per_rank, 8192, "Spawned daemon.");
ABSL_FLAG(uint64_t, host_pages_per_rank, 16384, "Spawned daemon.");
ABSL_FLAG(int32_t, transfer_workers, 2, "Spawned daemon: memcpy threads.");
ABSL_FLAG(int, backup_pages, 8, "BM_LayerStoredToStepDone: pages backed up.");
ABSL_FLAG(int, conversations, 16, "Conversations.");
ABSL_FLAG(int, turns, 8, "Turns per conversation.");
ABSL_FLAG(int, system_tokens, 1000, "Shared system prompt length.");
ABSL_FLAG(int, user_tokens_min, 32, "New user tokens per turn, at least.");
ABSL_FLAG(int, user_tokens_max, 256, "New user tokens per turn, at most.");
ABSL_FLAG(int, output_tokens_min, 64, "Output tokens per turn, at least.");
ABSL_FLAG(int, output_tokens_max, 256, "Output tokens per turn, at most.");
ABSL_FLAG(uint32_t, seed, 1, "Workload seed.");

namespace hicache {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Env {
  std::unique_ptr<bench::SpawnedDaemon> daemon;
  std::shared_ptr<v1::HiCache::Stub> stub;
  v1::GetLayoutResponse layout;
  uint32_t page_size = 0;
  uint32_t num_steps = 0;
  std::vector<uint32_t> ranks;  // Served ranks.
};
Env* env = nullptr;

// Opens a session (waiting up to 20 s for a daemon that is starting).
absl::StatusOr<std::unique_ptr<client::Session>> OpenSession(
    const std::string& name, v1::Role role, uint32_t rank,
    const std::string& ns) {
  return client::Session::Open(env->stub, name, role, rank, ns,
                               absl::Seconds(30), absl::Seconds(20));
}

// One session and one BackupStream per served rank, as the workers of a
// forward pass would have.
struct Workers {
  std::vector<std::unique_ptr<client::Session>> sessions;
  std::vector<std::unique_ptr<client::BackupStream>> streams;

  static absl::StatusOr<Workers> Open(const std::string& ns) {
    Workers workers;
    for (uint32_t rank : env->ranks) {
      auto session = OpenSession("flow-worker", v1::ROLE_WORKER, rank, ns);
      if (!session.ok()) return session.status();
      auto stream = (*session)->OpenBackupStream();
      if (!stream.ok()) return stream.status();
      workers.sessions.push_back(*std::move(session));
      workers.streams.push_back(*std::move(stream));
    }
    return workers;
  }
  // Every rank stores layer `step` of `backup` (its own rank only).
  absl::Status Store(uint64_t backup, uint32_t step) {
    for (auto& stream : streams) {
      if (absl::Status s = stream->LayerStored({backup}, step); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  // Closes the streams; the number of errors the daemon answered.
  int64_t Close() {
    int64_t errors = 0;
    for (auto& stream : streams) {
      (void)stream->Close();
      errors += static_cast<int64_t>(stream->TakeErrors().size());
    }
    return errors;
  }
};

// ---------------------------------------------------------------------------
// (a) layer_stored -> step_done.

void BM_LayerStoredToStepDone(benchmark::State& state) {
  const bool by_workers = state.range(0) == 1;
  static int run = 0;
  const std::string ns = absl::StrCat("latency-", run++);
  auto scheduler = OpenSession("flow-latency", v1::ROLE_SCHEDULER, 0, ns);
  if (!scheduler.ok()) {
    state.SkipWithError(std::string(scheduler.status().message()).c_str());
    return;
  }
  auto workers = Workers::Open(ns);
  auto stream = (*scheduler)->OpenBackupStream();
  if (!workers.ok() || !stream.ok()) {
    state.SkipWithError("cannot open the streams");
    return;
  }
  const int num_pages = absl::GetFlag(FLAGS_backup_pages);
  v1::AllocateItem item;
  item.set_num_pages(num_pages);
  auto allocation = (*scheduler)->Allocate({item});
  if (!allocation.ok()) {
    state.SkipWithError(std::string(allocation.status().message()).c_str());
    return;
  }
  v1::BackupSpec spec;
  *spec.mutable_pages() = allocation->allocations(0).pages();
  spec.set_logical_tokens(int64_t{num_pages} * env->page_size);
  const int ranks = static_cast<int>(env->ranks.size());
  Latencies latencies;
  uint64_t backup = 0;
  uint32_t step = env->num_steps;  // Prepare first.
  for (auto _ : state) {
    if (step == env->num_steps) {  // Untimed: a fresh backup.
      if (backup != 0) {
        (void)(*stream)->Rollback(backup);
        (void)(*stream)->WaitCommitted(backup);  // ABORTED: rolled back.
      }
      auto ids = (*stream)->Prepare({spec});
      if (!ids.ok() || ids->at(0) == 0) {
        state.SkipWithError("prepare failed");
        break;
      }
      (*stream)->ClearBuffered();
      (*stream)->ForgetEnded();
      backup = ids->at(0);
      step = 0;
    }
    const absl::Status status = latencies.Time([&]() -> absl::Status {
      const auto start = std::chrono::steady_clock::now();
      absl::Status s = by_workers ? workers->Store(backup, step)
                                  : (*stream)->LayerStored({backup}, step);
      int acks = 0;
      while (s.ok() && acks < ranks) {
        absl::StatusOr<v1::BackupServerMessage> m = (*stream)->Next();
        if (!m.ok()) {
          s = m.status();
        } else if (m->has_error()) {
          s = absl::InternalError(m->error().message());
        } else if (m->has_step_done() && m->step_done().step() == step) {
          ++acks;
        }
      }
      state.SetIterationTime(std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start)
                                 .count());
      return s;
    });
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    ++step;
  }
  if (backup != 0) (void)(*stream)->Rollback(backup);
  (void)(*stream)->Close();
  workers->Close();
  latencies.Report(state);
  state.counters["steps"] = env->num_steps;
  state.counters["ranks"] = ranks;
}
BENCHMARK(BM_LayerStoredToStepDone)->Arg(0)->Arg(1)->UseManualTime();

// ---------------------------------------------------------------------------
// (b) The request flow over a conversation workload.

struct Request {
  std::vector<int32_t> input;
  int64_t output_tokens = 0;
};

// Turn-major (every conversation's turn t before any turn t + 1), as a
// server interleaves its users.
std::vector<Request> BuildWorkload() {
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  auto uniform = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
  };
  const int conversations = absl::GetFlag(FLAGS_conversations);
  const int turns = absl::GetFlag(FLAGS_turns);
  std::vector<int32_t> system(absl::GetFlag(FLAGS_system_tokens));
  for (size_t i = 0; i < system.size(); ++i) system[i] = 1 + i;
  std::vector<std::vector<int32_t>> history(conversations, system);
  int32_t next_token = 1 << 20;  // Every user and output token is unique.
  std::vector<Request> requests;
  for (int t = 0; t < turns; ++t) {
    for (int c = 0; c < conversations; ++c) {
      std::vector<int32_t>& h = history[c];
      const int user = uniform(absl::GetFlag(FLAGS_user_tokens_min),
                               absl::GetFlag(FLAGS_user_tokens_max));
      for (int i = 0; i < user; ++i) h.push_back(next_token++);
      Request request{h, uniform(absl::GetFlag(FLAGS_output_tokens_min),
                                 absl::GetFlag(FLAGS_output_tokens_max))};
      for (int64_t i = 0; i < request.output_tokens; ++i) {
        h.push_back(next_token++);
      }
      requests.push_back(std::move(request));
    }
  }
  return requests;
}

// Per-request wall times, reported as Latencies does, plus quantiles.
class Samples {
 public:
  template <typename Fn>
  auto Time(Fn fn) {
    const auto start = std::chrono::steady_clock::now();
    auto result = fn();
    samples_.push_back(std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - start)
                           .count());
    return result;
  }
  double Quantile(double q) {
    if (samples_.empty()) return 0;
    std::sort(samples_.begin(), samples_.end());
    return samples_[std::min(samples_.size() - 1,
                             static_cast<size_t>(q * samples_.size()))];
  }
  void Report(benchmark::State& state, const std::string& prefix) {
    state.counters[prefix + "median_us"] = Quantile(0.5);
    state.counters[prefix + "p99_us"] = Quantile(0.99);
  }

 private:
  std::vector<double> samples_;
};

// One scheduler (and its workers) running requests one at a time, timing
// each from its first call to its last.
class Flow {
 public:
  static absl::StatusOr<std::unique_ptr<Flow>> Open(const std::string& ns,
                                                    bool admit) {
    auto flow = std::unique_ptr<Flow>(new Flow(admit));
    auto scheduler = OpenSession("flow-scheduler", v1::ROLE_SCHEDULER, 0, ns);
    if (!scheduler.ok()) return scheduler.status();
    flow->scheduler_ = *std::move(scheduler);
    auto stream = flow->scheduler_->OpenBackupStream();
    if (!stream.ok()) return stream.status();
    flow->stream_ = *std::move(stream);
    auto workers = Workers::Open(ns);
    if (!workers.ok()) return workers.status();
    flow->workers_ = *std::move(workers);
    return flow;
  }

  absl::Status Run(const Request& request) {
    return latencies_.Time([&] {
      input_tokens_ += static_cast<int64_t>(request.input.size());
      return admit_ ? RunAdmit(request) : RunLegacy(request);
    });
  }

  void Report(benchmark::State& state, const std::string& prefix) {
    latencies_.Report(state, prefix);
    state.counters[prefix + "hit_rate"] =
        input_tokens_ == 0 ? 0.0 : double(hit_tokens_) / input_tokens_;
    state.counters[prefix + "attached"] =
        backups_ == 0 ? 0.0 : double(attached_) / backups_;
    state.counters[prefix + "loads"] = loads_;
  }
  double Median() { return latencies_.Quantile(0.5); }

  // Ends the streams and the sessions; the daemon's error answers.
  int64_t Close() {
    int64_t errors = workers_.Close();
    (void)stream_->Close();
    errors += static_cast<int64_t>(stream_->TakeErrors().size());
    (void)scheduler_->Close();
    return errors;
  }

 private:
  explicit Flow(bool admit) : admit_(admit) {}

  absl::Status StoreLayers(uint64_t backup) {
    if (backup == 0) return absl::OkStatus();
    ++backups_;
    for (uint32_t step = 0; step < env->num_steps; ++step) {
      if (absl::Status s = workers_.Store(backup, step); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::Status RunAdmit(const Request& request) {
    auto admitted = scheduler_->Admit({client::MakeAdmitItem(
        request.input, request.output_tokens,
        v1::COMPUTE_OWNER_MODE_UNSPECIFIED, v1::BACKUP_CHOICE_ALWAYS)});
    if (!admitted.ok()) return admitted.status();
    const v1::AdmitResult& a = admitted->results(0);
    if (!a.admitted()) return absl::ResourceExhaustedError("not admitted");
    if (a.load()) {  // A host hit: load it back, then the v1.0 calls.
      ++loads_;
      std::vector<uint64_t> handles;
      if (a.lock_handle() != 0) handles.push_back(a.lock_handle());
      return LoadThenRest(request, std::move(handles));
    }
    hit_tokens_ += a.device().valid_tokens();
    if (absl::Status s = StoreLayers(a.backup_id()); !s.ok()) return s;
    const v1::CompleteItem item =
        client::MakeCompleteItem(a, request.input, env->page_size);
    for (int attempt = 0;; ++attempt) {
      auto completed = scheduler_->Complete({item});
      if (!completed.ok()) return completed.status();
      if (!completed->results(0).deferred()) {
        attached_ += completed->results(0).backup_attached();
        return absl::OkStatus();
      }
      if (attempt == 1000) return absl::DeadlineExceededError("deferred");
      absl::SleepFor(absl::Microseconds(100));
    }
  }

  absl::Status RunLegacy(const Request& request) {
    auto match = scheduler_->MatchPrefix({request.input}, {.lock = true});
    if (!match.ok()) return match.status();
    const v1::MatchResult& r = match->results(0);
    std::vector<uint64_t> handles = client::Session::LockHandles(*match);
    if (r.host_hit_tokens() > 0) {
      ++loads_;
      return LoadThenRest(request, std::move(handles));
    }
    hit_tokens_ += r.device().valid_tokens();
    return Rest(request, std::vector<int64_t>(r.device().pages().begin(),
                                              r.device().pages().end()),
                r.device().valid_tokens(), r.tail_blocked(),
                std::move(handles));
  }

  absl::Status LoadThenRest(const Request& request,
                            std::vector<uint64_t> handles) {
    auto loaded = scheduler_->LoadBack(request.input, request.output_tokens);
    if (!loaded.ok()) return loaded.status();
    if (loaded->lock_handle() != 0) handles.push_back(loaded->lock_handle());
    const v1::Locations& hit = loaded->started.locations();
    const int64_t hit_tokens = loaded->ok() ? hit.valid_tokens() : 0;
    hit_tokens_ += hit_tokens;
    std::vector<int64_t> pages;
    if (loaded->ok()) pages.assign(hit.pages().begin(), hit.pages().end());
    return Rest(request, std::move(pages), hit_tokens, false,
                std::move(handles));
  }

  // The v1.0 calls after the match: Allocate, prepare, layers, Insert,
  // Unlock, Free.
  absl::Status Rest(const Request& request, std::vector<int64_t> pages,
                    int64_t hit_tokens, bool tail_blocked,
                    std::vector<uint64_t> handles) {
    const int64_t len = static_cast<int64_t>(request.input.size());
    const int64_t page = env->page_size;
    const int64_t hit_pages = static_cast<int64_t>(pages.size());
    const int64_t need = CeilDiv(len + request.output_tokens, page) - hit_pages;
    const int64_t new_input = CeilDiv(len, page) - hit_pages;
    std::vector<int64_t> fresh;
    if (need > 0) {
      v1::AllocateItem item;
      item.set_num_pages(need);
      auto allocation = scheduler_->Allocate({item});
      if (!allocation.ok()) return allocation.status();
      fresh.assign(allocation->allocations(0).pages().begin(),
                   allocation->allocations(0).pages().end());
    }
    uint64_t backup = 0;
    if (new_input > 0 && !tail_blocked) {
      v1::BackupSpec spec;
      spec.mutable_pages()->Add(fresh.begin(), fresh.begin() + new_input);
      spec.set_logical_tokens(len - hit_tokens);
      auto ids = stream_->Prepare({spec});
      if (!ids.ok()) return ids.status();
      stream_->ClearBuffered();  // Earlier backups' progress: not needed.
      stream_->ForgetEnded();
      backup = ids->at(0);
    }
    if (absl::Status s = StoreLayers(backup); !s.ok()) return s;
    v1::InsertRequest insert;
    v1::InsertItem* item = insert.add_items();
    item->set_tokens(client::PackTokens(request.input));
    item->mutable_pages()->Add(pages.begin(), pages.end());
    item->mutable_pages()->Add(fresh.begin(),
                               fresh.begin() + std::max<int64_t>(0, new_input));
    item->set_backup_id(backup);
    absl::StatusOr<v1::InsertResponse> inserted;
    for (int attempt = 0;; ++attempt) {
      inserted = scheduler_->Insert(insert);
      if (!inserted.ok()) return inserted.status();
      if (!inserted->results(0).deferred()) break;
      if (attempt == 1000) return absl::DeadlineExceededError("deferred");
      absl::SleepFor(absl::Microseconds(100));
    }
    if (backup != 0) attached_ += inserted->results(0).backup_attached();
    if (!handles.empty()) {
      if (absl::Status s = scheduler_->UnlockHandles(handles); !s.ok()) {
        return s;
      }
    }
    std::vector<int64_t> free(inserted->results(0).uncached_pages().begin(),
                              inserted->results(0).uncached_pages().end());
    if (new_input < static_cast<int64_t>(fresh.size())) {
      free.insert(free.end(), fresh.begin() + std::max<int64_t>(0, new_input),
                  fresh.end());
    }
    if (free.empty()) return absl::OkStatus();
    return scheduler_->Free(free);
  }

  const bool admit_;
  std::unique_ptr<client::Session> scheduler_;
  std::unique_ptr<client::BackupStream> stream_;
  Workers workers_;
  Samples latencies_;
  int64_t input_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  int64_t backups_ = 0;
  int64_t attached_ = 0;
  int64_t loads_ = 0;
};

void BM_ConversationFlow(benchmark::State& state) {
  static const std::vector<Request>* const workload =
      new std::vector<Request>(BuildWorkload());
  static int run = 0;
  const int this_run = run++;
  auto admit = Flow::Open(absl::StrCat("admit-", this_run), /*admit=*/true);
  auto legacy = Flow::Open(absl::StrCat("legacy-", this_run), false);
  if (!admit.ok() || !legacy.ok()) {
    state.SkipWithError("cannot open the flows' sessions");
    return;
  }
  size_t next = 0;
  for (auto _ : state) {
    const Request& request = (*workload)[next++ % workload->size()];
    // Alternate which flow goes first, so neither always runs warm.
    Flow* first = next % 2 ? admit->get() : legacy->get();
    Flow* second = next % 2 ? legacy->get() : admit->get();
    absl::Status s = first->Run(request);
    if (s.ok()) s = second->Run(request);
    if (!s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      break;
    }
  }
  (*admit)->Report(state, "admit_");
  (*legacy)->Report(state, "legacy_");
  const double admit_median = (*admit)->Median();
  if (admit_median > 0) {
    state.counters["ratio_median"] = (*legacy)->Median() / admit_median;
  }
  state.counters["errors"] = (*admit)->Close() + (*legacy)->Close();
  state.counters["requests"] = static_cast<double>(next);
}

// Starts (or finds) the daemon and reads its layout.
absl::Status SetUp(const char* argv0) {
  env = new Env();
  auto daemon = bench::SpawnedDaemon::Start(
      argv0, "flow", absl::GetFlag(FLAGS_socket), absl::GetFlag(FLAGS_daemon),
      {absl::StrCat("--page_size=", absl::GetFlag(FLAGS_page_size)),
       absl::StrCat("--cp_size=", absl::GetFlag(FLAGS_cp_size)),
       "--kv_preset=" + absl::GetFlag(FLAGS_kv_preset),
       absl::StrCat("--device_pages_per_rank=",
                    absl::GetFlag(FLAGS_device_pages_per_rank)),
       absl::StrCat("--host_pages_per_rank=",
                    absl::GetFlag(FLAGS_host_pages_per_rank)),
       absl::StrCat("--transfer_workers=",
                    absl::GetFlag(FLAGS_transfer_workers))});
  if (!daemon.ok()) return daemon.status();
  env->daemon = *std::move(daemon);
  env->stub = v1::HiCache::NewStub(
      grpc::CreateChannel(client::UnixTarget(env->daemon->socket()),
                          grpc::InsecureChannelCredentials()));
  auto probe = OpenSession("flow-probe", v1::ROLE_SCHEDULER, 0, "");
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat(probe.status().message(),
                                     env->daemon->Running()
                                         ? ""
                                         : " (the daemon exited)"));
  }
  auto layout = (*probe)->GetLayout();
  if (!layout.ok()) return layout.status();
  env->layout = *layout;
  env->page_size = layout->geometry().page_size_tokens();
  env->num_steps = layout->num_steps();
  env->ranks.assign(layout->geometry().served_ranks().begin(),
                    layout->geometry().served_ranks().end());
  if (env->ranks.empty()) {
    for (uint32_t r = 0; r < layout->geometry().cp_size(); ++r) {
      env->ranks.push_back(r);
    }
  }
  std::fprintf(stderr,
               "flow_bench: P = %u, C = %u, %u steps (%s), %llu device "
               "pages per rank\n",
               env->page_size, layout->geometry().cp_size(), env->num_steps,
               layout->kv_preset().c_str(),
               static_cast<unsigned long long>(
                   layout->geometry().device_pages_per_rank()));
  return (*probe)->Close().status();
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  // One iteration: one request of the workload through both flows.
  benchmark::RegisterBenchmark("BM_ConversationFlow",
                               hicache::BM_ConversationFlow)
      ->UseRealTime()
      ->Iterations(int64_t{absl::GetFlag(FLAGS_conversations)} *
                   absl::GetFlag(FLAGS_turns));
  if (absl::Status s = hicache::SetUp(argv[0]); !s.ok()) {
    std::fprintf(stderr, "flow_bench: %s\n", std::string(s.message()).c_str());
    delete hicache::env;
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  delete hicache::env;  // Stops a spawned daemon.
  return 0;
}

