// Failure reporting and tracing of //fuzz:service_fuzzer (service_fuzzer.cc).
#pragma once

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache::fuzz {

// HICACHE_FUZZ_TRACE=1: Trace() prints every op and its status.
extern bool g_trace;

// Prints what failed (and the engine's accounting, when there is an engine)
// and traps, so that libFuzzer reports a crash.
[[noreturn]] void Fail(const std::string& what, const HiCacheEngine* engine);

template <typename... Args>
void Trace(const Args&... args) {
  if (!g_trace) return;
  std::fprintf(stderr, "  %s\n", absl::StrCat(args...).c_str());
}

}  // namespace hicache::fuzz
