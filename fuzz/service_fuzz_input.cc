#include "fuzz/service_fuzz_input.h"

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace hicache::fuzz {
namespace {

// Four base sequences: 1 shares 12 tokens (3 pages) with 0, 2 shares 5 (a page
// and one token) with 0, 3 is read from the input over {0, 1, 2}.
int32_t BaseToken(int base, size_t i) {
  const int32_t t0 = static_cast<int32_t>((i * 7 + 3) % 13);
  switch (base) {
    case 0:
      return t0;
    case 1:
      return i < 12 ? t0 : static_cast<int32_t>(50 + i % 5);
    default:
      return i < 5 ? t0 : static_cast<int32_t>(70 + (i * 3) % 7);
  }
}

}  // namespace

std::string Pack(const std::vector<int32_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()),
                     tokens.size() * sizeof(int32_t));
}

Tokens ReadTokens(Input& in) {
  const uint8_t b = in.Byte();
  const int base = b & 3;
  Tokens out;
  if (base == 3) {
    const size_t len = in.Below(25);
    for (size_t i = 0; i < len; ++i) out.tokens.push_back(in.Byte() % 3);
  } else {
    const size_t len = in.Below(41);
    for (size_t i = 0; i < len; ++i) out.tokens.push_back(BaseToken(base, i));
  }
  if ((b & 4) != 0 && !out.tokens.empty()) {
    const size_t at = in.Below(out.tokens.size());
    out.tokens[at] = 100 + in.Byte() % 4;
  }
  out.malformed = (b >> 3) == 31;
  return out;
}

int64_t TokenCount(Input& in) {
  const uint8_t b = in.Byte();
  if (b < 208) return b % 33;
  static constexpr int64_t kEdges[] = {
      -1,
      std::numeric_limits<int64_t>::min(),
      std::numeric_limits<int64_t>::max(),
      int64_t{1} << 24,
      (int64_t{1} << 24) + 1,
      (int64_t{1} << 24) - 1,
      int64_t{1} << 29,
      int64_t{1} << 62,
      4096,
      255,
      256,
      257,
      -4096,
      (int64_t{1} << 31) - 1,
      int64_t{1} << 31,
      2,
  };
  return kEdges[(b - 208) % std::size(kEdges)];
}

const char* OpName(int op) {
  static constexpr const char* kNames[] = {
      "Open",          "Close",       "Allocate",    "Free",
      "Match",         "Insert",      "Lock",        "Pin",
      "Evict",         "SetFreeRoom", "Prepare",     "LayerStored",
      "StoreAll",      "Rollback",    "StreamEnd",   "LoadBack",
      "FinishLoad",    "Settle",      "Advance",     "KeepAlive",
      "Inspect",       "Request",     "Admit",       "Complete",
      "UnlockHandles", "MatchExact",  "LoadBatch",   "FinishLoadRpc",
      "WorkerStore",   "Subscribe",   "Unsubscribe", "Fence",
      "BackupOpen",    "Flow",        "Hold",        "Quota"};
  static_assert(std::size(kNames) == kNumOps);
  return kNames[op];
}

}  // namespace hicache::fuzz
