// End-to-end: the real hicached binary on a temporary socket, driven by the
// real hicachectl binary, stopped with real signals.
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "grpcpp/grpcpp.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "hicache/v1/hicache.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/binaries.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using testing::RunResult;
using testing::Subprocess;

using testing::CtlPath;
using testing::DaemonPath;

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

RunResult Ctl(const std::string& socket, std::vector<std::string> args) {
  std::vector<std::string> argv = {CtlPath(), "--socket=" + socket};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<RunResult> result = testing::Run(argv);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : RunResult{};
}

class DaemonProcessTest : public ::testing::Test {
 protected:
  // Starts hicached with `flags` and waits until `hicachectl health` succeeds.
  Subprocess StartDaemon(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {DaemonPath(), "--socket=" + socket_};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(argv);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && daemon->Running()) {
      if (Exists(socket_) &&
          Ctl(socket_, {"--timeout=1", "health"}).exit_code == 0) {
        return *std::move(daemon);
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "hicached did not become healthy; stderr:\n"
                  << daemon->Stderr();
    return *std::move(daemon);
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
};

TEST_F(DaemonProcessTest, HealthStatsAndCleanSigtermShutdown) {
  Subprocess daemon = StartDaemon(
      {"--cp_size=2", "--page_size=32", "--device_pages_per_rank=1024",
       "--host_pages_per_rank=4096", "--host_layout=page_first"});

  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  RunResult health = Ctl(socket_, {"health"});
  EXPECT_EQ(health.exit_code, 0) << health.err;
  EXPECT_EQ(health.out, "SERVING\n");

  RunResult stats = Ctl(socket_, {"stats"});
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_THAT(stats.out, HasSubstr("backend:       cpu"));
  EXPECT_THAT(stats.out, HasSubstr("page size:     32 tokens"));
  EXPECT_THAT(stats.out, HasSubstr("cp size:       2 (ranks served: 0,1)"));
  EXPECT_THAT(stats.out, HasSubstr("1024 per rank, 2048 logical"));
  EXPECT_THAT(stats.out, HasSubstr("4096 per rank, page_first"));
  EXPECT_THAT(stats.out,
              HasSubstr(absl::StrCat("pid:           ", daemon.pid())));

  RunResult json = Ctl(socket_, {"--json", "stats"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  v1::GetStatsResponse parsed;  // One document: {"daemon": .., "cache": ..}.
  const nlohmann::json doc = nlohmann::json::parse(json.out, nullptr,
                                                   /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << json.out;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  doc["daemon"].dump(), &parsed)
                  .ok())
      << json.out;
  EXPECT_EQ(parsed.pid(), daemon.pid());
  EXPECT_EQ(parsed.backend(), v1::BACKEND_CPU);
  EXPECT_EQ(parsed.geometry().logical_device_pages(), 2048u);
  EXPECT_EQ(parsed.listen_address(), "unix:" + socket_);
  EXPECT_EQ(parsed.build().proto_package(), "hicache.v1");
  EXPECT_GE(parsed.uptime_seconds(), 0.0);

  ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
  absl::StatusOr<int> code = daemon.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << daemon.Stderr();
  EXPECT_THAT(daemon.Stderr(), HasSubstr("shutting down"));
  EXPECT_FALSE(Exists(socket_));
  EXPECT_FALSE(Exists(socket_ + ".lock"));

  RunResult after = Ctl(socket_, {"--timeout=1", "health"});
  EXPECT_EQ(after.exit_code, 1);
  EXPECT_THAT(after.err, HasSubstr("is hicached running"));
}

TEST_F(DaemonProcessTest, SigintAlsoShutsDownCleanly) {
  Subprocess daemon = StartDaemon();
  ASSERT_TRUE(daemon.Signal(SIGINT).ok());
  absl::StatusOr<int> code = daemon.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  EXPECT_FALSE(Exists(socket_));
}

TEST_F(DaemonProcessTest, SecondDaemonOnTheSameSocketIsRefused) {
  Subprocess first = StartDaemon();
  absl::StatusOr<RunResult> second =
      testing::Run({DaemonPath(), "--socket=" + socket_});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->exit_code, 1);
  EXPECT_THAT(second->err,
              HasSubstr(absl::StrCat("another hicached (pid ", first.pid())));
  // The first daemon is unharmed.
  EXPECT_EQ(Ctl(socket_, {"health"}).exit_code, 0);
}

TEST_F(DaemonProcessTest, StaleSocketOfAKilledDaemonIsReplaced) {
  {
    Subprocess victim = StartDaemon();
    ASSERT_TRUE(victim.Signal(SIGKILL).ok());
    ASSERT_TRUE(victim.Wait(absl::Seconds(10)).ok());
  }
  ASSERT_TRUE(Exists(socket_));  // SIGKILL left it behind.
  Subprocess daemon = StartDaemon();
  EXPECT_EQ(Ctl(socket_, {"health"}).exit_code, 0);
  EXPECT_THAT(daemon.Stderr(), HasSubstr("removed stale socket"));
}

TEST_F(DaemonProcessTest, BadFlagValuesExitNonZeroWithAClearMessage) {
  struct Case {
    std::vector<std::string> flags;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--page_size=48"}, 2, "page_size must be a power of two"},
      {{"--cp_size=0"}, 2, "cp_size must be in"},
      {{"--cp_size=2", "--ranks=0,5"}, 2, "served_ranks[1] = 5"},
      {{"--ranks=x"}, 2, "'x' is not a rank number"},
      {{"--log_level=loud"}, 2, "unknown level 'loud'"},
      {{"--backend=tpu"}, 2, "unknown backend 'tpu'"},
      {{"--gpus=0"}, 2, "gpus needs backend=cuda"},
      {{"--backend=cuda", "--cuda_runtime=fake"}, 2,
       "cuda_runtime must be 'real' or 'simulated'"},
      {{"--backend=cuda", "--cp_size=2", "--gpus=0"}, 2,
       "gpus lists 1 devices for 2 served ranks"},
      {{"--backend=cuda", "--gpus=x"}, 2, "'x' is not a device number"},
      {{"--backend=cuda", "--pin_host_memory=false"}, 2,
       "can only reach pinned host memory"},
      {{"--write_through_threshold=0"}, 2, "write_through_threshold must be"},
      {{"--transfer_workers=0"}, 2, "transfer_workers must be in [1, 64]"},
      {{"--l1_free_room_pages=-1"}, 2, "must be >= 0"},
      {{"--device_pages_per_rank=8", "--l1_free_room_pages=8"}, 2,
       "free room must be below the pool size"},
      {{"--host_pages_per_rank=64", "--host_bytes_per_rank=1000000"}, 2,
       "both size the host tier; give one of them"},
      {{"--host_bytes_per_rank=0"}, 2, "--host_bytes_per_rank must be > 0"},
      {{"--host_bytes_per_rank=100"}, 2,
       "host_bytes_per_rank = 100 holds no host page"},
      {{"--kv_preset=llama"}, 2, "unknown KV preset 'llama'"},
      {{"--kv_layout_file=/nonexistent/layout.json"}, 2,
       "cannot read KV layout file '/nonexistent/layout.json'"},
      {{"--kv_preset=tiny", "--kv_layout_file=/nonexistent/layout.json"}, 2,
       "--kv_preset and --kv_layout_file both name the KV layout"},
      {{"--write_policy=write_sideways"}, 2,
       "unknown write policy 'write_sideways'; expected write_through, "
       "write_through_selective, write_back or write_ahead"},
      {{"--eviction_policy=mru"}, 2, "unknown eviction policy 'mru'"},
      {{"--page_size=abc"}, 2, "page_size"},
      {{"--no_such_flag"}, 2, "no_such_flag"},
      {{"--log_format=xml"}, 2, "expected 'text' or 'json'"},
      {{"--flagfile=/nonexistent/hicached.flags"}, 2,
       "/nonexistent/hicached.flags"},
      {{"stray_argument"}, 2, "unexpected argument 'stray_argument'"},
      {{"--instance=9lives"}, 2, "instance"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {DaemonPath(), "--socket=" + socket_};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    absl::StatusOr<RunResult> r = testing::Run(argv);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, c.exit_code) << c.flags[0] << "\n" << r->err;
    EXPECT_THAT(r->err, HasSubstr(c.message)) << c.flags[0];
    EXPECT_FALSE(Exists(socket_)) << c.flags[0];
  }
}

// --kv_layout_file: a model's layout from a file (Llama 3 8B's K and V, 32
// layers of 2 KiB rows); GetLayout reports it under the file's name, and a
// file the parser refuses stops the daemon with exit 2 and the reason.
TEST_F(DaemonProcessTest, KvLayoutFileConfiguresTheGeometry) {
  Subprocess daemon = StartDaemon(
      {"--kv_layout_file=" +
           testing::RunfilePath("deploy/kv-layouts/llama-3-8b.json"),
       "--page_size=16", "--device_pages_per_rank=16",
       "--host_pages_per_rank=16"});
  auto channel = grpc::CreateChannel("unix:" + socket_,
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::HiCache::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetLayoutResponse layout;
  const grpc::Status status =
      stub->GetLayout(&context, v1::GetLayoutRequest(), &layout);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(layout.kv_preset(), "llama-3-8b");
  ASSERT_EQ(layout.families_size(), 2);
  for (int f = 0; f < 2; ++f) {
    EXPECT_EQ(layout.families(f).name(), f == 0 ? "k" : "v");
    EXPECT_EQ(layout.families(f).bytes_per_token(), 2048u);
    EXPECT_EQ(layout.families(f).num_layers(), 32u);
  }
  EXPECT_EQ(layout.bytes_per_page(), 16u * 131072u);
  EXPECT_EQ(layout.num_steps(), 32u);
  EXPECT_EQ(layout.device_blocks_size(), 64);
  ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
  ASSERT_TRUE(daemon.Wait(absl::Seconds(20)).ok());

  const std::string bad = dir_.Child("bad.json");
  {
    FILE* f = fopen(bad.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(R"({"name": "m", "families": [{"name": "k", "bytes_per_token": 6,
              "layers": 2}]})",
          f);
    fclose(f);
  }
  absl::StatusOr<RunResult> r = testing::Run(
      {DaemonPath(), "--socket=" + socket_, "--kv_layout_file=" + bad});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2) << r->err;
  EXPECT_THAT(r->err, HasSubstr("bytes_per_token must be a positive multiple "
                                "of 4"));
  EXPECT_FALSE(Exists(socket_));
}

// hicachectl shm against real daemons: a running one's instance is live and
// left alone; a SIGKILLed one's segments stay (stopped) until 'shm clean'
// removes them, and then /dev/shm holds nothing of it.
TEST_F(DaemonProcessTest, ShmCleanRemovesWhatAKilledDaemonLeft) {
  const std::string instance = absl::StrCat("shmtest", getpid());
  Subprocess daemon = StartDaemon({"--instance=" + instance,
                                   "--device_pages_per_rank=8",
                                   "--host_pages_per_rank=8"});
  RunResult r = Ctl(socket_, {"--json", "shm", "list"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto state_of = [&](const std::string& out) -> std::string {
    const nlohmann::json doc = nlohmann::json::parse(out, nullptr, false);
    if (doc.is_discarded()) return "unparsed";
    for (const auto& i : doc["instances"]) {
      if (i["instance"] == instance) {
        return i["state"].get<std::string>() + " " +
               std::to_string(i["segments"].size());
      }
    }
    return "absent";
  };
  EXPECT_EQ(state_of(r.out), "live 2");  // Device and host pool of rank 0.
  r = Ctl(socket_, {"shm", "clean", "--instance=" + instance});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(instance + ": live"));
  EXPECT_EQ(state_of(Ctl(socket_, {"--json", "shm", "list"}).out), "live 2");

  ASSERT_TRUE(daemon.Signal(SIGKILL).ok());
  ASSERT_TRUE(daemon.Wait(absl::Seconds(20)).ok());
  EXPECT_EQ(state_of(Ctl(socket_, {"--json", "shm", "list"}).out),
            "stopped 2");
  r = Ctl(socket_, {"shm", "clean", "--instance=" + instance});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("removed 2 segments"));
  EXPECT_EQ(state_of(Ctl(socket_, {"--json", "shm", "list"}).out), "absent");
}

// --host_bytes_per_rank: one budget for the target and draft KV of each
// rank's host tier. "tiny-draft" at P = 64 takes 64 x (32 + 8) = 2560 bytes a
// page; 1 MB holds 409 pages (1047040 bytes), 1536 bytes unused.
TEST_F(DaemonProcessTest, HostByteBudgetIsSplitAndReported) {
  Subprocess daemon = StartDaemon(
      {"--kv_preset=tiny-draft", "--host_bytes_per_rank=1048576"});
  RunResult stats = Ctl(socket_, {"stats"});
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_THAT(stats.out, HasSubstr("409 per rank, layer_first"));
  ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
  ASSERT_TRUE(daemon.Wait(absl::Seconds(20)).ok());
  EXPECT_THAT(daemon.Stderr(),
              HasSubstr("host tier per rank: budget 1048576 bytes -> 409 "
                        "pages of 2560 bytes, 26176 tokens each for target "
                        "(837632 bytes) and draft (209408 bytes), 1536 bytes "
                        "unused"));
  EXPECT_THAT(daemon.Stderr(), HasSubstr("host_pages_per_rank=409"));
}

// Without a GPU (every CI machine), --backend=cuda is a configuration error
// that says why; a pool larger than /dev/shm is refused at start.
TEST_F(DaemonProcessTest, CudaBackendWithoutAGpuExitsTwoAndSaysWhy) {
  if (access("/dev/nvidia0", F_OK) == 0) {
    GTEST_SKIP() << "a GPU is present: tools/gpu_check runs the CUDA backend";
  }
  absl::StatusOr<RunResult> r =
      testing::Run({DaemonPath(), "--socket=" + socket_, "--backend=cuda"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2) << r->err;
  EXPECT_THAT(r->err, ::testing::AnyOf(HasSubstr("no CUDA device is visible"),
                                       HasSubstr("built without CUDA")));
  EXPECT_FALSE(Exists(socket_));
  r = testing::Run({DaemonPath(), "--socket=" + socket_, "--cp_size=8",
                    "--kv_preset=deepseek-v3.2-fp8",
                    "--device_pages_per_rank=100000"});
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->exit_code, 0);
  EXPECT_THAT(r->err, HasSubstr("/dev/shm has"));
}

TEST_F(DaemonProcessTest, VersionAndHelpExitZero) {
  absl::StatusOr<RunResult> r = testing::Run({DaemonPath(), "--version"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->err;
  // "hicached 0.2.0 (<12 hex digits>[-dirty])", or "(unknown)" when built
  // outside a git checkout.
  EXPECT_THAT(r->out, ::testing::MatchesRegex(
                          "hicached [0-9]+\\.[0-9]+\\.[0-9]+ "
                          "\\(([0-9a-f]{12}(-dirty)?|unknown)\\)\n"));
  r = testing::Run({DaemonPath(), "--help"});
  ASSERT_TRUE(r.ok());
  // Every KV preset is listed.
  for (const char* preset :
       {"deepseek-v3.2,", "deepseek-v3.2-fp8", "llama-3-8b", "llama-3-70b",
        "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b",
        "glm-4-9b", "glm-4.5", "mistral-7b", "micro", "tiny-draft",
        "--kv_layout_file"}) {
    EXPECT_THAT(r->out + r->err, HasSubstr(preset));
  }
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_THAT(r->out + r->err, HasSubstr("--flagfile"));
}

// --flagfile: '#' comment lines, one --flag=value per line, later command-line
// flags override it; the daemon reports the revision it was built from.
TEST_F(DaemonProcessTest, FlagfileConfiguresTheDaemon) {
  const std::string flagfile = dir_.Child("hicached.flags");
  {
    FILE* f = fopen(flagfile.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("# hicached configuration\n--page_size=32\n--cp_size=2\n", f);
    fclose(f);
  }
  Subprocess daemon =
      StartDaemon({"--flagfile=" + flagfile, "--cp_size=4"});
  RunResult stats = Ctl(socket_, {"--json", "stats"});
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  const nlohmann::json doc = nlohmann::json::parse(stats.out, nullptr,
                                                   /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << stats.out;
  const nlohmann::json& json = doc["daemon"];  // hicachectl: daemon + cache.
  EXPECT_EQ(json["geometry"]["page_size_tokens"], 32) << stats.out;
  EXPECT_EQ(json["geometry"]["cp_size"], 4) << stats.out;
  EXPECT_THAT(json["build"]["git_revision"].get<std::string>(),
              ::testing::MatchesRegex("[0-9a-f]{12}(-dirty)?|unknown"));
  ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
  absl::StatusOr<int> code = daemon.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
}

// --log_format=json: every stderr line is one JSON object with a UTC
// timestamp, including lines that quote client-supplied text.
TEST_F(DaemonProcessTest, JsonLogsAreOneObjectPerLineInUtc) {
  Subprocess daemon =
      StartDaemon({"--log_format=json", "--log_level=debug"});
  ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
  absl::StatusOr<int> code = daemon.Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  const std::string err = daemon.Stderr();
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(err, '\n', absl::SkipEmpty())) {
    ++lines;
    EXPECT_THAT(std::string(line),
                ::testing::MatchesRegex(
                    "\\{\"ts\":\"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:"
                    "[0-9]{2}\\.[0-9]{3}Z\",\"level\":\"[a-z]+\",\"logger\":"
                    "\"hicached\",\"thread\":[0-9]+,\"msg\":\".*\"\\}"));
  }
  EXPECT_GE(lines, 3) << err;
  EXPECT_THAT(err, HasSubstr("\"msg\":\"hicached stopped\""));
}

TEST_F(DaemonProcessTest, CtlHelpDocumentsExitCodes) {
  absl::StatusOr<RunResult> r = testing::Run({CtlPath(), "--help"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_THAT(r->out, HasSubstr("Exit codes:"));
}

}  // namespace
}  // namespace hicache
