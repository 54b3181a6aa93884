#pragma once

// The GPU check's verdict and its two reports: gpu_check.json (everything
// measured, for tools) and gpu_check.md (a summary for a closing note).
//
// Verdict:
//   pass    a GPU ran every test binary without a failure, the bench ran and
//           its goals were met (656-byte rows: kernel >= 90% of cudaMemcpy in
//           both directions; step completion latency p50 <= 100 us);
//   no_gpu  CUDA saw no GPU and nothing that could run without one failed
//           (the tests skip, the bench says "skipped");
//   fail    anything else: a test failed, timed out or could not run on a
//           GPU machine, the bench failed or missed a goal, nvidia-smi lists
//           a GPU that CUDA does not see.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tools/gpu_runner/gtest_results.h"

namespace hicache::gpu_runner {

struct PhaseRecord {
  std::string name;
  int rc = 0;
  double seconds = 0;
  double limit_s = 0;
  bool timed_out = false;
};

struct TestRecord {
  std::string name;    // The binary, e.g. "real_cuda_runtime_test".
  std::string status;  // pass, fail, skip, not_run.
  GtestResults results;
  std::string note;    // Why it did not run, or why it failed without cases.
};

struct NcclInfo {
  bool found = false;
  std::string lib_dir;  // Holds libnccl.so.2.
  std::string note;     // How it was found, or why not.
};

struct CheckInputs {
  absl::Time started;
  double wall_s = 0;
  bool quick = false;
  bool require_gpu = false;
  bool stopped_early = false;  // --require-gpu without a GPU.
  nlohmann::json bundle;       // The bundle's manifest.
  std::vector<std::string> nvidia_smi;  // `nvidia-smi -L` lines.
  std::string driver;                   // Driver version, if known.
  int cuda_gpus = 0;                    // GPUs the CUDA runtime sees.
  std::string cuda_note;                // Why none, if none.
  NcclInfo nccl;
  std::vector<PhaseRecord> phases;
  std::vector<TestRecord> tests;
  nlohmann::json bench;        // The bench's document; null if none.
  std::string bench_error;     // Why there is none, or it is unusable.
  std::string host;
};

struct CheckReport {
  std::string verdict;  // pass, fail, no_gpu.
  std::vector<std::string> problems;
  nlohmann::json json;
  std::string markdown;
};

CheckReport BuildReport(const CheckInputs& in);

}  // namespace hicache::gpu_runner
