#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/hicache_engine.h"

namespace hicache::testing {

// Deterministic "KV" for tests: the bytes of token t in (family, layer) are
// a function of the hash of tokens[0..t], as real KV depends on the whole
// prefix. Written straight into the device pool of the page's owner rank.
void WriteKv(const HiCacheEngine& engine, absl::Span<const int32_t> tokens,
             absl::Span<const LogicalPage> pages, int64_t from_token);

// Checks the first `valid` tokens' KV in `pages`; the error names the first
// wrong (page, family, layer, token).
absl::Status VerifyKv(const HiCacheEngine& engine,
                      absl::Span<const int32_t> tokens,
                      absl::Span<const LogicalPage> pages, int64_t valid);

}  // namespace hicache::testing
