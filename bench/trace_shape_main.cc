// Prints the shape of Mooncake-format traces (bench/trace_shape.h), to
// compare a generated workload with real traffic:
//
//   bazel run //bench:trace_shape -- --json bench/traces/*.jsonl
//
// One table (or one JSON line with --json) per trace.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "bench/cache_bound.h"
#include "bench/mooncake_trace.h"
#include "bench/trace_shape.h"

ABSL_FLAG(bool, json, false, "one JSON object per trace instead of a table");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trace_shape [--json] TRACE.jsonl...: the per-block shape statistics "
      "of Mooncake-format traces (bench/trace_shape.h)");
  std::vector<char*> paths = absl::ParseCommandLine(argc, argv);
  paths.erase(paths.begin());
  if (paths.empty()) {
    std::fprintf(stderr, "usage: trace_shape [--json] TRACE.jsonl...\n");
    return 2;
  }
  int rc = 0;
  for (const char* path : paths) {
    auto trace = hicache::ReadMooncakeTrace(path);
    if (!trace.ok()) {
      std::fprintf(stderr, "%s: %s\n", path,
                   trace.status().ToString().c_str());
      rc = 1;
      continue;
    }
    const hicache::TraceShape shape =
        hicache::MeasureShape(hicache::BlockTrace::Build(*trace));
    if (absl::GetFlag(FLAGS_json)) {
      std::cout << "{\"trace\": \"" << path << "\", \"shape\": "
                << hicache::ShapeJson(shape) << "}\n";
    } else {
      std::cout << "# " << path << "\n";
      hicache::PrintShapeTable(shape, std::cout);
    }
  }
  return rc;
}
