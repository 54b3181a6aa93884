// Writes the matched workload (bench/matched_trace.h) in Mooncake format, or
// fits its options to target shape statistics (bench/trace_shape.h):
//
//   bazel run //bench:make_matched_trace -- --out=$PWD/matched.jsonl
//   bazel run //bench:make_matched_trace -- --fit=400
//
// --fit=N: N steps of a seeded random local search from the defaults,
// minimising the largest relative error against the --target_* figures
// (default: the Mooncake conversation trace's, issue 25's table); prints
// the best options and their shape. The defaults in matched_trace.h came
// from such a run (bench/traces/README.md).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "bench/cache_bound.h"
#include "bench/conversation_trace.h"
#include "bench/matched_trace.h"
#include "bench/trace_shape.h"

ABSL_FLAG(std::string, out, "", "write the trace here (else stdout)");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int64_t, requests, 12031, "requests");
ABSL_FLAG(int, fit, 0, "fit the options with this many search steps");
ABSL_FLAG(uint64_t, fit_seed, 1, "seed of the search (not of the trace)");
ABSL_FLAG(double, target_unique_used_once, 0.758, "fit target");
ABSL_FLAG(double, target_refs_to_used_once, 0.481, "fit target");
ABSL_FLAG(std::vector<std::string>, target_reuse,
          std::vector<std::string>({"4545", "9275", "21803", "41730"}),
          "fit target: reuse distance p25,p50,p75,p90");
ABSL_FLAG(std::vector<std::string>, target_blocks,
          std::vector<std::string>({"14", "54", "167"}),
          "fit target: blocks per request p50,p90,p99");
ABSL_FLAG(double, target_infinite, 0.3664, "fit target");

namespace hicache {
namespace {

std::vector<double> Targets() {
  std::vector<double> t = {absl::GetFlag(FLAGS_target_unique_used_once),
                           absl::GetFlag(FLAGS_target_refs_to_used_once)};
  for (const auto& v : absl::GetFlag(FLAGS_target_reuse)) t.push_back(std::stod(v));
  for (const auto& v : absl::GetFlag(FLAGS_target_blocks)) t.push_back(std::stod(v));
  t.push_back(absl::GetFlag(FLAGS_target_infinite));
  return t;
}

std::vector<double> Figures(const TraceShape& s) {
  return {s.unique_used_once, s.refs_to_used_once, s.reuse_p25, s.reuse_p50,
          s.reuse_p75,        s.reuse_p90,         s.blocks_p50, s.blocks_p90,
          s.blocks_p99,       s.infinite_hit_rate};
}

// The largest relative error of the shape against the targets.
double Error(const MatchedTraceOptions& o, TraceShape* shape) {
  auto trace = GenerateMatchedTrace(o);
  if (!trace.ok()) return 1e9;
  *shape = MeasureShape(BlockTrace::Build(*trace));
  const std::vector<double> got = Figures(*shape);
  const std::vector<double> want = Targets();
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]) / want[i]);
  }
  return worst;
}

// The search's objective: the sum of squared relative errors (smoother
// than the largest, which it also keeps small).
double Objective(const MatchedTraceOptions& o, TraceShape* shape,
                 double* worst) {
  *worst = Error(o, shape);
  const std::vector<double> got = Figures(*shape);
  const std::vector<double> want = Targets();
  double sum = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double e = (got[i] - want[i]) / want[i];
    sum += e * e;
  }
  return sum + *worst * *worst;
}

void PrintOptions(const MatchedTraceOptions& o) {
  std::printf(
      "slots=%lld slot_zipf_s=%.9g one_shot_p=%.9g mean_turns=%.9g system_prompt_p=%.9g "
      "system_prompts=%lld system_zipf_s=%.9g system_blocks=[%lld,%lld] "
      "first_median_blocks=%.9g first_sigma=%.9g turn_median_blocks=%.9g "
      "turn_sigma=%.9g max_blocks=%lld\n",
      static_cast<long long>(o.slots), o.slot_zipf_s, o.one_shot_p,
      o.mean_turns,
      o.system_prompt_p, static_cast<long long>(o.system_prompts),
      o.system_zipf_s, static_cast<long long>(o.system_min_blocks),
      static_cast<long long>(o.system_max_blocks), o.first_median_blocks,
      o.first_sigma, o.turn_median_blocks, o.turn_sigma,
      static_cast<long long>(o.max_blocks));
}

MatchedTraceOptions Perturb(MatchedTraceOptions o, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> scale(0.85, 1.15);
  switch (rng() % 13) {
    case 0: o.slots = std::max<int64_t>(1, std::llround(o.slots * scale(rng))); break;
    case 1: o.slot_zipf_s = std::max(0.0, o.slot_zipf_s * scale(rng) + (rng() % 2 ? 0.02 : -0.02)); break;
    case 2: o.mean_turns = std::max(2.0, o.mean_turns * scale(rng)); break;
    case 12: o.one_shot_p = std::clamp(o.one_shot_p * scale(rng), 0.0, 1.0); break;
    case 3: o.system_prompt_p = std::clamp(o.system_prompt_p * scale(rng), 0.0, 1.0); break;
    case 4: o.system_prompts = std::max<int64_t>(1, std::llround(o.system_prompts * scale(rng))); break;
    case 5: o.first_median_blocks = std::max(0.5, o.first_median_blocks * scale(rng)); break;
    case 6: o.first_sigma = std::max(0.0, o.first_sigma * scale(rng)); break;
    case 7: o.turn_median_blocks = std::max(0.5, o.turn_median_blocks * scale(rng)); break;
    case 8: o.turn_sigma = std::max(0.0, o.turn_sigma * scale(rng)); break;
    case 10: o.system_zipf_s = std::max(0.0, o.system_zipf_s * scale(rng)); break;
    case 11: o.max_blocks = std::max<int64_t>(8, std::llround(o.max_blocks * scale(rng))); break;
    case 9: o.system_max_blocks = std::max<int64_t>(o.system_min_blocks, std::llround(o.system_max_blocks * scale(rng))); break;
  }
  return o;
}

int Main() {
  MatchedTraceOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.requests = absl::GetFlag(FLAGS_requests);
  if (const int steps = absl::GetFlag(FLAGS_fit); steps > 0) {
    std::mt19937_64 rng(absl::GetFlag(FLAGS_fit_seed));
    TraceShape shape;
    double worst = 0;
    double best = Objective(options, &shape, &worst);
    for (int i = 0; i < steps; ++i) {
      MatchedTraceOptions candidate = Perturb(options, rng);
      TraceShape candidate_shape;
      double candidate_worst = 0;
      const double objective =
          Objective(candidate, &candidate_shape, &candidate_worst);
      if (objective < best) {
        best = objective;
        worst = candidate_worst;
        options = candidate;
        shape = candidate_shape;
        std::fprintf(stderr, "step %d: worst relative error %.9g\n", i,
                     worst);
      }
    }
    std::printf("worst relative error %.9g\n", worst);
    PrintOptions(options);
    PrintShapeTable(shape, std::cout);
    return 0;
  }
  auto trace = GenerateMatchedTrace(options);
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", trace.status().ToString().c_str());
    return 2;
  }
  std::ofstream file;
  std::ostream* out = &std::cout;
  if (const std::string path = absl::GetFlag(FLAGS_out); !path.empty()) {
    file.open(path);
    out = &file;
  }
  for (const TraceRequest& request : *trace) {
    *out << MooncakeLine(request) << "\n";
  }
  return out->good() ? 0 : 1;
}

}  // namespace
}  // namespace hicache

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "make_matched_trace [--out=FILE] [--fit=N]: the matched workload "
      "(bench/matched_trace.h)");
  absl::ParseCommandLine(argc, argv);
  return hicache::Main();
}
