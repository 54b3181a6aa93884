// gpu_check_runner: the GPU check, run from a GPU bundle (tools/gpu_bundle)
// on a machine that has nothing but the NVIDIA driver. gpu_bundle/run starts
// it through the bundle's own loader; it
//
//   1. points the bundle's loader link (the interpreter every bundled binary
//      names, under /tmp) at this bundle's lib/;
//   2. records `nvidia-smi -L` and the driver version, and asks the CUDA
//      runtime how many GPUs it sees (through the bench's --probe);
//   3. finds NCCL from the nvidia-nccl-cu13 wheel of the machine's python3
//      (or $HICACHE_NCCL_LIB_DIR), which the bundle does not carry;
//   4. runs each test binary of the manifest with HICACHE_CUDA_RUNTIME=real,
//      each in its own time box, then the bench (kernel against cudaMemcpy
//      and cudaMemcpyBatchAsync, step completion latency, pinning, and the
//      copy-engine ceiling), also time-boxed: a phase that fails or times out
//      is recorded and the next one runs;
//   5. writes gpu_check.json, gpu_check.md, bench.json and the logs
//      (gpu_check_logs.gz) into --out, nothing else.
//
// Exit status: 0 pass or no_gpu (1 with --require-gpu), 1 fail, 2 usage.

#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "tools/gpu_runner/gpu_check_report.h"
#include "tools/gpu_runner/gtest_results.h"
#include "tools/gpu_runner/timed_command.h"

ABSL_FLAG(std::string, bundle, "", "the bundle's directory (gpu_bundle/)");
ABSL_FLAG(std::string, out, "",
          "where the reports go (default $OUT, else ./gpu_check_out)");
ABSL_FLAG(bool, quick, false, "fewer bench repetitions, no 64 GiB pinning");
ABSL_FLAG(bool, require_gpu, false,
          "no GPU is a failure (exit 1), and nothing else runs");
ABSL_FLAG(int, total_s, 420, "the time box of the whole check, in seconds");

namespace hicache::gpu_runner {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr char kDefaultPath[] =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

std::string Env(const char* name, const std::string& fallback = "") {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    lines.emplace_back(absl::StripAsciiWhitespace(line));
  }
  return lines;
}

class Runner {
 public:
  Runner(fs::path bundle, fs::path out, fs::path work)
      : bundle_(std::move(bundle)),
        out_(std::move(out)),
        work_(std::move(work)),
        start_(absl::Now()),
        total_(absl::Seconds(absl::GetFlag(FLAGS_total_s))) {}

  int Run() {
    in_.started = start_;
    in_.quick = absl::GetFlag(FLAGS_quick);
    in_.require_gpu = absl::GetFlag(FLAGS_require_gpu);
    utsname name{};
    if (uname(&name) == 0) in_.host = name.nodename;
    in_.bundle = json::parse(ReadFile(bundle_ / "manifest.json"), nullptr,
                             /*allow_exceptions=*/false);
    if (in_.bundle.is_discarded() || !in_.bundle.is_object()) {
      std::fprintf(stderr, "gpu_check_runner: no readable %s\n",
                   (bundle_ / "manifest.json").c_str());
      return 2;
    }
    if (!LinkLoader()) return 1;
    ProbeGpu();
    if (in_.cuda_gpus == 0 && in_.require_gpu) {
      in_.stopped_early = true;
      return Finish();
    }
    FindNccl();
    const json tests = in_.bundle.value("tests", json::array());
    for (size_t i = 0; i < tests.size(); ++i) {
      // Each later test keeps at least 20 s, the bench 90 s.
      RunTest(tests[i], 20.0 * (tests.size() - i - 1) + 90);
    }
    RunBench();
    return Finish();
  }

 private:
  void Log(const std::string& line) {
    std::fprintf(stderr, "[gpu_check] %s\n", line.c_str());
  }

  // Seconds for the next phase: at most `cap`, leaving `reserve` for the
  // phases after it; at least 10.
  absl::Duration Budget(double cap, double reserve) {
    const double left =
        absl::ToDoubleSeconds(start_ + total_ - absl::Now()) - reserve;
    return absl::Seconds(std::max(10.0, std::min(cap, left)));
  }

  // Every bundled binary names <loader_link>/ld-linux-x86-64.so.2 as its
  // interpreter: the link must point at this bundle's lib/.
  bool LinkLoader() {
    const std::string link = in_.bundle.value("loader_link", "");
    if (link.empty()) {
      Log("the manifest names no loader_link");
      return false;
    }
    const fs::path target = bundle_ / "lib";
    std::error_code ec;
    const fs::file_status status = fs::symlink_status(link, ec);
    if (fs::exists(status) && !fs::is_symlink(status)) {
      Log(absl::StrCat(link, " exists and is not a link: remove it"));
      return false;
    }
    const std::string temp = absl::StrCat(link, ".", getpid());
    fs::remove(temp, ec);
    fs::create_directory_symlink(target, temp, ec);
    if (!ec) fs::rename(temp, link, ec);
    if (ec) {
      Log(absl::StrCat("cannot link ", link, " to ", target.string(), ": ",
                       ec.message()));
      return false;
    }
    return true;
  }

  // Runs a program of the machine (not of the bundle) and returns its
  // output, or "" if it is absent or fails.
  std::string MachineCommand(const std::string& name,
                             std::vector<std::string> args,
                             const std::string& log_name) {
    const std::string path = FindInPath(name, Env("PATH", kDefaultPath));
    if (path.empty()) return "";
    args.insert(args.begin(), path);
    const fs::path log = work_ / log_name;
    absl::StatusOr<CommandResult> result = RunTimed(
        {.argv = args,
         .env = {"PATH=" + Env("PATH", kDefaultPath), "HOME=" + Env("HOME", "/")},
         .log_path = log.string(),
         .limit = absl::Seconds(30),
         .grace = absl::Seconds(2)});
    if (!result.ok() || result->rc != 0) return "";
    return ReadFile(log);
  }

  void ProbeGpu() {
    const absl::Time t0 = absl::Now();
    for (const std::string& line :
         Lines(MachineCommand("nvidia-smi", {"-L"}, "nvidia-smi.txt"))) {
      if (line.rfind("GPU ", 0) == 0) in_.nvidia_smi.push_back(line);
    }
    const std::vector<std::string> driver = Lines(MachineCommand(
        "nvidia-smi", {"--query-gpu=driver_version", "--format=csv,noheader"},
        "nvidia-smi-driver.txt"));
    if (!driver.empty()) in_.driver = driver.front();
    // The bench counts the GPUs (this runner links no CUDA).
    const fs::path probe = work_ / "probe.json";
    const std::string bench =
        in_.bundle.value("bench", json::object()).value("path", "");
    absl::StatusOr<CommandResult> ran =
        RunTimed({.argv = {(bundle_ / bench).string(), "--probe",
                           "--out=" + probe.string()},
                  .env = BinaryEnv("probe"),
                  .log_path = (work_ / "probe.log").string(),
                  .limit = absl::Seconds(60)});
    const json answer = json::parse(ReadFile(probe), nullptr,
                                    /*allow_exceptions=*/false);
    if (answer.is_object() && answer.contains("devices") &&
        answer["devices"].is_number_integer()) {
      in_.cuda_gpus = answer["devices"].get<int>();
      in_.cuda_note = answer.value("note", "");
    } else {
      in_.cuda_note = absl::StrCat(
          "the GPU probe (", bench, " --probe) failed: ",
          ran.ok() ? absl::StrCat("exit ", ran->rc) : ran.status().ToString(),
          "; see probe.log");
    }
    if (FindInPath("nvidia-smi", Env("PATH", kDefaultPath)).empty()) {
      in_.cuda_note += in_.cuda_note.empty() ? "" : "; ";
      in_.cuda_note += "no nvidia-smi on PATH";
    }
    in_.phases.push_back({.name = "probe",
                          .seconds = absl::ToDoubleSeconds(absl::Now() - t0),
                          .limit_s = 60});
    Log(absl::StrCat("nvidia-smi: ", in_.nvidia_smi.size(),
                     " GPU(s); CUDA sees ", in_.cuda_gpus,
                     in_.cuda_note.empty() ? "" : " (" + in_.cuda_note + ")"));
  }

  void FindNccl() {
    NcclInfo& nccl = in_.nccl;
    std::string dir = Env("HICACHE_NCCL_LIB_DIR");
    std::string how = "from $HICACHE_NCCL_LIB_DIR";
    if (dir.empty()) {
      const std::vector<std::string> out = Lines(MachineCommand(
          "python3",
          {"-c",
           "import nvidia.nccl, os; "
           "print(os.path.dirname(nvidia.nccl.__file__))"},
          "nccl-python.txt"));
      if (!out.empty()) dir = out.back() + "/lib";
      how = "from the nvidia-nccl-cu13 wheel of python3";
    }
    if (!dir.empty() && access((dir + "/libnccl.so.2").c_str(), R_OK) == 0) {
      nccl = {.found = true, .lib_dir = dir, .note = how + ": " + dir};
    } else {
      nccl.note = dir.empty()
                      ? "python3 -c 'import nvidia.nccl' found no wheel (set "
                        "HICACHE_NCCL_LIB_DIR to a directory holding "
                        "libnccl.so.2)"
                      : absl::StrCat("no libnccl.so.2 in ", dir);
    }
    Log("NCCL: " + nccl.note);
  }

  // The environment of a bundled binary: the test runfiles (hicached at
  // bin/daemon/hicached), a private temp dir, the real CUDA runtime, NCCL.
  std::vector<std::string> BinaryEnv(const std::string& phase) {
    const fs::path tmp = work_ / "tmp" / phase;
    fs::create_directories(tmp);
    std::vector<std::string> env = {
        "PATH=" + (bundle_ / "bin").string() + ":" + Env("PATH", kDefaultPath),
        "HOME=" + Env("HOME", tmp.string()),
        "TMPDIR=" + tmp.string(),
        "TEST_TMPDIR=" + tmp.string(),
        "TEST_SRCDIR=" + bundle_.string(),
        "TEST_WORKSPACE=bin",
        "HICACHE_CUDA_RUNTIME=real",
    };
    if (in_.nccl.found) env.push_back("LD_LIBRARY_PATH=" + in_.nccl.lib_dir);
    for (const char* pass : {"CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"}) {
      if (const std::string v = Env(pass); !v.empty()) {
        env.push_back(absl::StrCat(pass, "=", v));
      }
    }
    return env;
  }

  PhaseRecord Phase(const std::string& name, std::vector<std::string> argv,
                    double cap, double reserve, const fs::path& log,
                    CommandResult* result_out = nullptr) {
    const absl::Duration limit = Budget(cap, reserve);
    Log(absl::StrCat(name, " (up to ", absl::ToInt64Seconds(limit), " s)"));
    PhaseRecord record{.name = name, .limit_s = absl::ToDoubleSeconds(limit)};
    absl::StatusOr<CommandResult> result =
        RunTimed({.argv = std::move(argv),
                  .env = BinaryEnv(name),
                  .log_path = log.string(),
                  .limit = limit});
    if (!result.ok()) {
      record.rc = 127;
      std::ofstream(log, std::ios::app) << result.status() << "\n";
      Log(absl::StrCat(name, ": ", result.status().ToString()));
    } else {
      record.rc = result->rc;
      record.timed_out = result->timed_out;
      record.seconds = absl::ToDoubleSeconds(result->elapsed);
      if (result_out != nullptr) *result_out = *result;
      if (record.timed_out) {
        Log(absl::StrCat(name, ": timed out after ", record.limit_s, " s"));
      } else if (record.rc != 0) {
        Log(absl::StrCat(name, ": exit ", record.rc));
      }
    }
    in_.phases.push_back(record);
    return record;
  }

  void RunTest(const json& test, double reserve_s) {
    TestRecord record{.name = test.value("name", "?")};
    if (test.value("needs_nccl", false) && !in_.nccl.found) {
      record.status = "not_run";
      record.note = "needs NCCL, which is absent";
      in_.tests.push_back(record);
      return;
    }
    const fs::path report = work_ / (record.name + ".json");
    std::vector<std::string> argv = {
        (bundle_ / test.value("path", "")).string(),
        "--gtest_output=json:" + report.string()};
    const PhaseRecord phase =
        Phase(record.name, argv, test.value("limit_s", 60.0), reserve_s,
              work_ / (record.name + ".log"));
    absl::StatusOr<GtestResults> results = ParseGtestJson(ReadFile(report));
    if (results.ok()) {
      record.results = *results;
      record.status = results->Status();
      if (phase.rc != 0 && record.status != "fail") {
        record.status = "fail";
        record.note = absl::StrCat("exit ", phase.rc);
      }
    } else {
      record.status = "fail";
      record.note = phase.timed_out
                        ? "timed out"
                        : absl::StrCat("exit ", phase.rc, ", no report");
    }
    in_.tests.push_back(record);
  }

  void RunBench() {
    const json bench = in_.bundle.value("bench", json::object());
    if (bench.value("needs_nccl", false) && !in_.nccl.found) {
      in_.bench_error = "the bench needs NCCL, which is absent";
      return;
    }
    const fs::path doc = out_ / "bench.json";
    std::error_code ec;
    fs::remove(doc, ec);
    std::vector<std::string> argv = {(bundle_ / bench.value("path", "")).string(),
                                     "--out=" + doc.string()};
    if (in_.quick) argv.push_back("--quick");
    const PhaseRecord phase =
        Phase("bench", argv, 240, 5, work_ / "bench.log");
    const std::string text = ReadFile(doc);
    if (text.empty()) {
      in_.bench_error = phase.timed_out ? "the bench timed out"
                                        : absl::StrCat("the bench exited ",
                                                       phase.rc,
                                                       " without a document");
      return;
    }
    in_.bench = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (in_.bench.is_discarded()) {
      in_.bench = nullptr;
      in_.bench_error = "bench.json is not JSON";
    }
  }

  // All logs, each behind a header line, in one gzip file.
  void ArchiveLogs() {
    const fs::path archive = out_ / "gpu_check_logs.gz";
    gzFile gz = gzopen(archive.c_str(), "wb9");
    if (gz == nullptr) {
      Log("cannot write " + archive.string());
      return;
    }
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& entry : fs::recursive_directory_iterator(work_, ec)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      const std::string header = absl::StrCat(
          "\n===== ", fs::relative(file, work_).string(), " =====\n");
      gzwrite(gz, header.data(), header.size());
      // The last 4 MiB of a log: enough for a failure, bounded for $OUT.
      std::string text = ReadFile(file);
      constexpr size_t kMax = 4 << 20;
      if (text.size() > kMax) text = "[...]\n" + text.substr(text.size() - kMax);
      gzwrite(gz, text.data(), text.size());
    }
    gzclose(gz);
  }

  int Finish() {
    in_.wall_s = absl::ToDoubleSeconds(absl::Now() - start_);
    const CheckReport report = BuildReport(in_);
    std::ofstream(out_ / "gpu_check.json") << report.json.dump(2) << "\n";
    std::ofstream(out_ / "gpu_check.md") << report.markdown;
    ArchiveLogs();
    Log(absl::StrCat("verdict: ", report.verdict, "; wrote ",
                     (out_ / "gpu_check.json").string(), " and gpu_check.md (",
                     absl::ToInt64Seconds(absl::Now() - start_), " s)"));
    std::printf("%s\n", report.verdict.c_str());
    if (report.verdict == "pass") return 0;
    if (report.verdict == "no_gpu") return in_.require_gpu ? 1 : 0;
    return 1;
  }

  const fs::path bundle_, out_, work_;
  const absl::Time start_;
  const absl::Duration total_;
  CheckInputs in_;
};

}  // namespace
}  // namespace hicache::gpu_runner

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  absl::SetProgramUsageMessage(
      "the GPU check of a GPU bundle; run it as gpu_bundle/run (see the top "
      "of tools/gpu_runner/gpu_check_runner.cc)");
  // --require-gpu and --total-s are accepted as spelled in tools/gpu_check.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> arg_ptrs;
  for (std::string& arg : args) {
    if (arg.rfind("--", 0) == 0) {
      const size_t end = std::min(arg.find('='), arg.size());
      std::replace(arg.begin() + 2, arg.begin() + end, '-', '_');
    }
    arg_ptrs.push_back(arg.data());
  }
  const std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (rest.size() > 1 || absl::GetFlag(FLAGS_bundle).empty()) {
    std::fprintf(stderr, "usage: gpu_bundle/run [--quick] [--require-gpu] "
                         "[--out=DIR] [--total_s=S]\n");
    return 2;
  }
  std::error_code ec;
  const fs::path bundle = fs::canonical(absl::GetFlag(FLAGS_bundle), ec);
  if (ec) {
    std::fprintf(stderr, "gpu_check_runner: bundle %s: %s\n",
                 absl::GetFlag(FLAGS_bundle).c_str(), ec.message().c_str());
    return 2;
  }
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) out = hicache::gpu_runner::Env("OUT", "gpu_check_out");
  fs::create_directories(out, ec);
  const fs::path out_dir = fs::absolute(out, ec);
  // Logs and temp files live apart from $OUT, which gets four files.
  std::string work_template =
      (fs::path(hicache::gpu_runner::Env("TMPDIR", "/tmp")) / "gpu_check.XXXXXX")
          .string();
  if (mkdtemp(work_template.data()) == nullptr) {
    std::perror("gpu_check_runner: mkdtemp");
    return 1;
  }
  const int rc =
      hicache::gpu_runner::Runner(bundle, out_dir, work_template).Run();
  fs::remove_all(work_template, ec);
  return rc;
}
