#include "tools/gpu_runner/gpu_check_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hicache::gpu_runner {
namespace {

using nlohmann::json;

// `v` printed with a printf format of one double; "–" if not a number.
std::string Num(const json& v, const char* format = "%.2f") {
  if (!v.is_number()) return "–";
  char text[64];
  std::snprintf(text, sizeof(text), format, v.get<double>());
  return text;
}

// doc[key] as a string or number, or `fallback` when doc is not an object or
// has no such member of that type.
std::string Str(const json& doc, const char* key, const std::string& fallback) {
  if (!doc.is_object() || !doc.contains(key) || !doc[key].is_string()) {
    return fallback;
  }
  return doc[key].get<std::string>();
}
int Int(const json& doc, const char* key) {
  if (!doc.is_object() || !doc.contains(key) || !doc[key].is_number()) {
    return 0;
  }
  return doc[key].get<int>();
}
double Real(const json& doc, const char* key) {
  if (!doc.is_object() || !doc.contains(key) || !doc[key].is_number()) {
    return 0;
  }
  return doc[key].get<double>();
}

const json& At(const json& doc, const std::vector<std::string>& path) {
  static const json kNull;
  const json* cur = &doc;
  for (const std::string& key : path) {
    if (!cur->is_object() || !cur->contains(key)) return kNull;
    cur = &(*cur)[key];
  }
  return *cur;
}

json RatioGoal(const json& bench, bool gpu, const std::string& direction) {
  json goal = {{"name", absl::StrCat("656-B rows ", direction == "d2h" ? "D2H"
                                                                       : "H2D",
                                     ": kernel >= 90% of cudaMemcpy")},
               {"threshold", 0.9}};
  if (!gpu) {
    goal["status"] = "not_checked";
    return goal;
  }
  json values = json::object();
  bool ok = true;
  for (const json& e : At(bench, {"bandwidth"})) {
    if (Int(e, "row_bytes") != 656 || Str(e, "direction", "") != direction)
      continue;
    const json& ratio = At(e, {"kernel_vs_memcpy"});
    values[Str(e, "host_layout", "?")] = ratio;
    ok = ok && ratio.is_number() && ratio.get<double>() >= 0.9;
  }
  goal["values"] = values;
  goal["status"] = ok && !values.empty() ? "pass" : "fail";
  return goal;
}

json LatencyGoal(const json& bench, bool gpu) {
  json goal = {{"name", "step completion latency p50 <= 100 us"},
               {"threshold_us", 100}};
  if (!gpu) {
    goal["status"] = "not_checked";
    return goal;
  }
  json values = json::object();
  bool ok = true;
  for (const char* d : {"d2h", "h2d"}) {
    const json& v = At(bench, {"completion_latency", d, "latency_us", "median"});
    values[d] = v;
    ok = ok && v.is_number() && v.get<double>() <= 100;
  }
  goal["values_us"] = values;
  goal["status"] = ok ? "pass" : "fail";
  return goal;
}

// Per direction, the best median kernel GB/s over the 656-byte rows'
// layouts divided by the copy-engine ceiling's median.
json KernelVsCeiling(const json& bench) {
  json out = json::object();
  for (const char* d : {"d2h", "h2d"}) {
    const json& ceiling = At(bench, {"copy_engine", d, "gbps", "median"});
    double best = 0;
    for (const json& e : At(bench, {"bandwidth"})) {
      const json& k = At(e, {"methods", "kernel", "gbps", "median"});
      if (Int(e, "row_bytes") == 656 && Str(e, "direction", "") == d &&
          k.is_number()) {
        best = std::max(best, k.get<double>());
      }
    }
    if (ceiling.is_number() && ceiling.get<double>() > 0 && best > 0) {
      out[d] = best / ceiling.get<double>();
    }
  }
  return out;
}

}  // namespace

CheckReport BuildReport(const CheckInputs& in) {
  CheckReport report;
  const bool bench_ran = in.bench.is_object();
  const bool bench_skipped = bench_ran && in.bench.contains("skipped");
  const bool gpu = in.cuda_gpus > 0;
  std::vector<std::string>& problems = report.problems;

  json tests = json::object();
  for (const TestRecord& t : in.tests) {
    json entry = {{"status", t.status},
                  {"passed", t.results.passed},
                  {"failed", t.results.failed},
                  {"skipped", t.results.skipped}};
    if (!t.note.empty()) entry["note"] = t.note;
    if (!t.results.failures.empty()) entry["failures"] = t.results.failures;
    if (!t.results.skip_reasons.empty()) {
      entry["skip_reasons"] = t.results.skip_reasons;
    }
    tests[t.name] = entry;
    if (t.status == "fail") {
      problems.push_back(absl::StrCat(t.name, ": fail",
                                      t.note.empty() ? "" : " (" + t.note + ")"));
    } else if (t.status == "not_run" && (gpu || in.nccl.found ||
                                         t.note.find("NCCL") == std::string::npos)) {
      // Without a GPU and without NCCL, a binary that needs NCCL cannot
      // start; that is reported, not failed. Anything else that did not run
      // is a failure.
      problems.push_back(absl::StrCat(t.name, ": not run (", t.note, ")"));
    } else if (t.status == "skip" && gpu) {
      problems.push_back(
          absl::StrCat(t.name, ": every case skipped on a GPU machine"));
    }
  }
  if (!bench_ran) {
    problems.push_back(absl::StrCat("bench: ", in.bench_error.empty()
                                                   ? "no output"
                                                   : in.bench_error));
  }
  json goals = json::array({RatioGoal(in.bench, gpu && bench_ran, "d2h"),
                            RatioGoal(in.bench, gpu && bench_ran, "h2d"),
                            LatencyGoal(in.bench, gpu && bench_ran)});
  if (gpu) {
    if (bench_skipped) {
      problems.push_back(absl::StrCat("bench skipped on a GPU machine: ",
                                      in.bench["skipped"].dump()));
    }
    for (const json& g : goals) {
      if (g["status"] != "pass") {
        problems.push_back("goal not met: " + g["name"].get<std::string>());
      }
    }
    for (const json& e : At(in.bench, {"errors"})) {
      problems.push_back("bench: " + (e.is_string() ? e.get<std::string>()
                                                     : e.dump()));
    }
    if (!in.nccl.found) problems.push_back("NCCL absent: " + in.nccl.note);
  } else if (!in.nvidia_smi.empty() && !in.stopped_early) {
    problems.push_back(absl::StrCat("nvidia-smi lists ", in.nvidia_smi.size(),
                                    " GPU(s) but CUDA sees none: ",
                                    in.cuda_note));
  }
  for (const PhaseRecord& p : in.phases) {
    if (p.timed_out) problems.push_back(p.name + " timed out");
  }
  if (in.stopped_early) {
    report.verdict = "no_gpu";
    problems = {"--require-gpu and no GPU: stopped before the tests"};
  } else if (!problems.empty()) {
    report.verdict = "fail";
  } else {
    report.verdict = gpu ? "pass" : "no_gpu";
  }

  json phases = json::object();
  for (const PhaseRecord& p : in.phases) {
    phases[p.name] = {{"rc", p.rc},
                      {"seconds", std::round(p.seconds * 10) / 10},
                      {"limit_s", p.limit_s},
                      {"timed_out", p.timed_out}};
  }
  json& doc = report.json;
  doc = {{"tool", "gpu_bundle/run"},
         {"verdict", report.verdict},
         {"problems", problems},
         {"started", absl::FormatTime(absl::RFC3339_sec, in.started,
                                      absl::UTCTimeZone())},
         {"wall_s", std::round(in.wall_s * 10) / 10},
         {"quick", in.quick},
         {"host", in.host},
         {"bundle", in.bundle},
         {"gpu",
          {{"nvidia_smi", in.nvidia_smi},
           {"driver", in.driver},
           {"cuda_gpus", in.cuda_gpus},
           {"cuda_note", in.cuda_note}}},
         {"nccl",
          {{"found", in.nccl.found},
           {"lib_dir", in.nccl.lib_dir},
           {"note", in.nccl.note}}},
         {"phases", phases},
         {"tests", tests},
         {"goals", goals},
         {"bench", in.bench}};
  if (!in.bench_error.empty()) doc["bench_error"] = in.bench_error;
  if (gpu && bench_ran) doc["kernel_656_vs_copy_engine"] = KernelVsCeiling(in.bench);

  // --- Markdown ---------------------------------------------------------------
  std::vector<std::string> md = {"# GPU check (gpu_bundle/run)", ""};
  std::string verdict_line = "**Verdict: " + report.verdict + "**";
  if (report.verdict == "no_gpu") {
    verdict_line += in.stopped_early ? " (--require-gpu: nothing ran)"
                                     : " (the GPU tests skip; the goals need a "
                                       "GPU)";
  }
  md.push_back(verdict_line);
  md.push_back("");
  md.push_back(absl::StrCat(
      "- GPU: ",
      in.nvidia_smi.empty() ? "none (nvidia-smi: " + in.cuda_note + ")"
                            : absl::StrJoin(in.nvidia_smi, "; "),
      in.driver.empty() ? "" : "; driver " + in.driver,
      "; CUDA sees ", in.cuda_gpus));
  md.push_back("- NCCL: " + std::string(in.nccl.found ? "found, " : "absent, ") +
               in.nccl.note);
  md.push_back(absl::StrCat("- bundle ", Str(in.bundle, "commit", "?"),
                            ", built ", Str(in.bundle, "built", "?"), "; ",
                            doc["started"].get<std::string>(), ", ",
                            Num(doc["wall_s"], "%.0f"), " s",
                            in.quick ? ", --quick" : ""));
  if (bench_skipped) md.push_back("- bench: " + in.bench["skipped"].dump());
  for (const std::string& p : problems) md.push_back("- problem: " + p);
  md.push_back("");
  md.push_back("| test binary | result | passed | failed | skipped |");
  md.push_back("|---|---|---|---|---|");
  for (const TestRecord& t : in.tests) {
    md.push_back(absl::StrCat("| `", t.name, "` | ", t.status,
                              t.note.empty() ? "" : " (" + t.note + ")", " | ",
                              t.results.passed, " | ", t.results.failed, " | ",
                              t.results.skipped, " |"));
  }
  md.push_back("");
  md.push_back("| goal | result | measured |");
  md.push_back("|---|---|---|");
  for (const json& g : goals) {
    std::vector<std::string> measured;
    const json& values = g.contains("values") ? g["values"]
                         : g.contains("values_us") ? g["values_us"]
                                                   : json::object();
    for (auto it = values.begin(); it != values.end(); ++it) {
      measured.push_back(it.key() + " " + Num(it.value()));
    }
    md.push_back(absl::StrCat("| ", g["name"].get<std::string>(), " | ",
                              g["status"].get<std::string>(), " | ",
                              measured.empty() ? "–" : absl::StrJoin(measured, ", "),
                              " |"));
  }
  if (gpu && bench_ran && !bench_skipped) {
    const json& bench = in.bench;
    md.push_back("");
    md.push_back(absl::StrCat(
        "Bandwidth on ", At(bench, {"device", "name"}).is_string()
                             ? bench["device"]["name"].get<std::string>()
                             : "?",
        " (GB/s, median of ", At(bench, {"config", "reps"}).dump(),
        " reps; ratio = kernel / cudaMemcpy):"));
    md.push_back("");
    md.push_back(
        "| row B | dir | host layout | kernel | kernel (quota) | cudaMemcpy | "
        "cudaMemcpyBatchAsync | ratio | verified |");
    md.push_back("|---|---|---|---|---|---|---|---|---|");
    for (const json& e : At(bench, {"bandwidth"})) {
      auto gbps = [&](const char* method) {
        return Num(At(e, {"methods", method, "gbps", "median"}), "%.1f");
      };
      const json& verified = At(e, {"verified"});
      md.push_back(absl::StrCat(
          "| ", At(e, {"row_bytes"}).dump(), " | ", Str(e, "direction", "–"),
          " | ", Str(e, "host_layout", Str(e, "error", "–")), " | ",
          gbps("kernel"), " | ", gbps("kernel_quota"), " | ", gbps("memcpy"),
          " | ", gbps("memcpy_batch"), " | ", Num(At(e, {"kernel_vs_memcpy"})),
          " | ",
          verified.is_boolean() ? (verified.get<bool>() ? "yes" : "NO") : "–",
          " |"));
    }
    const json& ce = At(bench, {"copy_engine"});
    const json ceiling = KernelVsCeiling(bench);
    if (ce.is_object() && !ce.contains("error")) {
      md.push_back("");
      md.push_back(absl::StrCat(
          "Copy-engine ceiling (cudaMemcpyAsync of ",
          Num(At(ce, {"bytes"}).is_number()
                  ? json(At(ce, {"bytes"}).get<double>() / (1 << 20))
                  : json(),
              "%.0f"),
          " MiB, pinned host, GB/s median): H2D ",
          Num(At(ce, {"h2d", "gbps", "median"}), "%.1f"), ", D2H ",
          Num(At(ce, {"d2h", "gbps", "median"}), "%.1f"),
          "; best 656-B kernel / ceiling: H2D ",
          Num(At(ceiling, {"h2d"})), ", D2H ", Num(At(ceiling, {"d2h"}))));
    } else if (ce.is_object()) {
      md.push_back("");
      md.push_back("Copy-engine ceiling: " + ce["error"].dump());
    }
    for (const char* d : {"d2h", "h2d"}) {
      md.push_back("");
      md.push_back(absl::StrCat(
          "Step completion latency ", d, ": p50 ",
          Num(At(bench, {"completion_latency", d, "latency_us", "median"}),
              "%.1f"),
          " us, p99 ",
          Num(At(bench, {"completion_latency", d, "latency_us", "p99"}), "%.1f"),
          " us (submit to OnStepDone p50 ",
          Num(At(bench,
                 {"completion_latency", d, "submit_to_done_us", "median"}),
              "%.1f"),
          " us)"));
    }
    const json& pin = At(bench, {"pin"});
    md.push_back("");
    if (pin.is_object() && pin.contains("register_s")) {
      md.push_back(absl::StrCat(
          "Pinning ", Num(json(Real(pin, "bytes") / (1ull << 30)), "%.1f"),
          " GiB (", Str(pin, "memory", "?"), "): register ",
          Num(pin["register_s"]), " s, unregister ",
          Num(At(pin, {"unregister_s"})), " s"));
    } else {
      md.push_back("Pinning: " + (pin.is_object() ? pin.dump() : "not measured"));
    }
  }
  std::vector<std::string> phase_text;
  for (const PhaseRecord& p : in.phases) {
    phase_text.push_back(absl::StrCat(
        p.name, " ", Num(json(p.seconds), "%.0f"), "s",
        p.timed_out ? " (timed out)"
                    : p.rc != 0 ? absl::StrCat(" (exit ", p.rc, ")") : ""));
  }
  md.push_back("");
  md.push_back("Phases: " + absl::StrJoin(phase_text, ", "));
  md.push_back("");
  report.markdown = absl::StrJoin(md, "\n");
  return report;
}

}  // namespace hicache::gpu_runner
