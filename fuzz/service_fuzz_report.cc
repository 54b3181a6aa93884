#include "fuzz/service_fuzz_report.h"

#include <cstdio>
#include <string>

#include "daemon/engine/hicache_engine.h"

namespace hicache::fuzz {

bool g_trace = false;

void Fail(const std::string& what, const HiCacheEngine* engine) {
  std::fprintf(stderr, "\nservice_fuzzer: INVARIANT VIOLATED: %s\n",
               what.c_str());
  if (engine != nullptr) {
    std::fprintf(stderr, "service_fuzzer: accounting: %s\n",
                 engine->AccountingString().c_str());
  }
  std::fflush(stderr);
  __builtin_trap();
}

}  // namespace hicache::fuzz
