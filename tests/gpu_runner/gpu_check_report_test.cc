#include "tools/gpu_runner/gpu_check_report.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace hicache::gpu_runner {
namespace {

using nlohmann::json;

TestRecord Record(const std::string& name, const std::string& status,
                int passed, int skipped, const std::string& note = "") {
  TestRecord t{.name = name, .status = status, .note = note};
  t.results.passed = passed;
  t.results.skipped = skipped;
  if (status == "fail") t.results.failed = 1;
  return t;
}

// A bench document as gpu_transfer_bench writes it, with the given ratios
// and latency.
json Bench(double d2h_ratio, double h2d_ratio, double p50_us) {
  json bench = {{"device", {{"name", "NVIDIA H200"}}},
                {"config", {{"reps", 30}}},
                {"errors", json::array()}};
  for (const char* layout : {"layer_first", "page_first"}) {
    bench["bandwidth"].push_back(
        {{"row_bytes", 656},
         {"direction", "d2h"},
         {"host_layout", layout},
         {"kernel_vs_memcpy", d2h_ratio},
         {"methods", {{"kernel", {{"gbps", {{"median", 40.0}}}}}}}});
    bench["bandwidth"].push_back(
        {{"row_bytes", 656},
         {"direction", "h2d"},
         {"host_layout", layout},
         {"kernel_vs_memcpy", h2d_ratio},
         {"methods", {{"kernel", {{"gbps", {{"median", 45.0}}}}}}}});
  }
  for (const char* d : {"d2h", "h2d"}) {
    bench["completion_latency"][d]["latency_us"]["median"] = p50_us;
    bench["copy_engine"][d]["gbps"]["median"] = 50.0;
  }
  return bench;
}

CheckInputs NoGpu() {
  CheckInputs in;
  in.cuda_note = "0 CUDA devices; no nvidia-smi on PATH";
  in.tests = {Record("real_cuda_runtime_test", "pass", 2, 9),
              Record("cuda_transfer_engine_test", "skip", 0, 12),
              Record("nccl_communicator_test", "not_run", 0, 0,
                   "needs NCCL, which is absent")};
  in.bench = {{"skipped", "no GPU: 0 CUDA devices visible"}};
  return in;
}

TEST(GpuCheckReportTest, WithoutAGpuSkipsAreNoGpuAndNcclAbsenceIsTolerated) {
  const CheckReport r = BuildReport(NoGpu());
  EXPECT_EQ(r.verdict, "no_gpu") << r.json.dump(2);
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(r.json["tests"]["nccl_communicator_test"]["status"], "not_run");
  EXPECT_EQ(r.json["goals"][0]["status"], "not_checked");
  EXPECT_TRUE(absl::StrContains(r.markdown, "**Verdict: no_gpu**"));
}

TEST(GpuCheckReportTest, WithoutAGpuAFailingTestOrMissingBenchFails) {
  CheckInputs in = NoGpu();
  in.tests.push_back(Record("page_copy_test", "fail", 0, 0, "exit 1"));
  CheckReport r = BuildReport(in);
  EXPECT_EQ(r.verdict, "fail");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_TRUE(absl::StrContains(r.problems[0], "page_copy_test"));

  in = NoGpu();
  in.bench = nullptr;
  in.bench_error = "the bench exited 127 without a document";
  EXPECT_EQ(BuildReport(in).verdict, "fail");

  // A test that could not start for another reason than NCCL is a failure.
  in = NoGpu();
  in.tests.push_back(Record("cuda_daemon_test", "not_run", 0, 0, "spawn: EACCES"));
  EXPECT_EQ(BuildReport(in).verdict, "fail");
}

TEST(GpuCheckReportTest, NvidiaSmiSeeingAGpuThatCudaDoesNotIsAFailure) {
  CheckInputs in = NoGpu();
  in.nvidia_smi = {"GPU 0: NVIDIA H200 (UUID: GPU-1)"};
  const CheckReport r = BuildReport(in);
  EXPECT_EQ(r.verdict, "fail");
  EXPECT_TRUE(absl::StrContains(r.problems[0], "CUDA sees none"));
}

CheckInputs OnGpu() {
  CheckInputs in;
  in.nvidia_smi = {"GPU 0: NVIDIA H200 (UUID: GPU-1)"};
  in.driver = "580.65";
  in.cuda_gpus = 1;
  in.nccl = {.found = true, .lib_dir = "/x/lib", .note = "wheel: /x/lib"};
  in.tests = {Record("real_cuda_runtime_test", "pass", 11, 0),
              Record("cuda_byte_integrity_test", "pass", 4, 4)};
  in.bench = Bench(0.95, 0.97, 40);
  return in;
}

TEST(GpuCheckReportTest, OnAGpuEveryGoalMetPasses) {
  const CheckReport r = BuildReport(OnGpu());
  EXPECT_EQ(r.verdict, "pass") << r.json.dump(2);
  EXPECT_NEAR(r.json["kernel_656_vs_copy_engine"]["h2d"].get<double>(), 0.9,
              1e-9);
  EXPECT_TRUE(absl::StrContains(r.markdown, "Copy-engine ceiling"));
  EXPECT_TRUE(absl::StrContains(r.markdown, "NVIDIA H200"));
}

TEST(GpuCheckReportTest, OnAGpuAMissedGoalASkippedBinaryOrNoNcclFails) {
  CheckInputs in = OnGpu();
  in.bench = Bench(0.95, 0.85, 40);
  CheckReport r = BuildReport(in);
  EXPECT_EQ(r.verdict, "fail");
  EXPECT_TRUE(absl::StrContains(r.problems[0], "H2D"));
  EXPECT_EQ(r.json["goals"][1]["status"], "fail");

  in = OnGpu();
  in.bench = Bench(0.95, 0.95, 150);
  EXPECT_EQ(BuildReport(in).verdict, "fail");

  in = OnGpu();
  in.tests.push_back(Record("cuda_transfer_engine_test", "skip", 0, 12));
  EXPECT_EQ(BuildReport(in).verdict, "fail");

  in = OnGpu();
  in.nccl = {.found = false, .note = "no wheel"};
  in.tests.push_back(Record("nccl_communicator_test", "not_run", 0, 0,
                          "needs NCCL, which is absent"));
  r = BuildReport(in);
  EXPECT_EQ(r.verdict, "fail");
  EXPECT_EQ(r.problems.size(), 2u);
}

TEST(GpuCheckReportTest, ATimedOutPhaseFailsAndRequireGpuStopsEarly) {
  CheckInputs in = OnGpu();
  in.phases = {{.name = "cuda_daemon_test", .rc = 124, .timed_out = true}};
  EXPECT_EQ(BuildReport(in).verdict, "fail");

  in = NoGpu();
  in.stopped_early = true;
  in.require_gpu = true;
  const CheckReport r = BuildReport(in);
  EXPECT_EQ(r.verdict, "no_gpu");
  EXPECT_TRUE(absl::StrContains(r.markdown, "--require-gpu"));
}

}  // namespace
}  // namespace hicache::gpu_runner
