#pragma once

// The bandwidth section of //bench:gpu_transfer_bench (see its header
// comment): per row size, direction and host layout, the batched
// gather/scatter kernel (max_blocks 0 and ctx.max_blocks) against one
// contiguous cudaMemcpyAsync of the same bytes and cudaMemcpyBatchAsync of
// the same block list.

#include <cstdint>
#include <vector>

#include "bench/gpu_bench_support.h"

namespace hicache::bench {

// Writes "bandwidth": [one entry per (row, direction, host layout)] to
// `json` (an entry with "error" for a row that could not run; also added
// to ctx.errors, as is a failed verification). Uses ctx.stream and the
// timing events ctx.start / ctx.end.
void RunBandwidth(BenchContext& ctx, const std::vector<uint32_t>& rows,
                  JsonWriter& json);

// Writes "copy_engine": the machine's own host<->device ceiling, measured
// as nvbandwidth does: one cudaMemcpyAsync of `bytes` between a pinned host
// buffer (cudaHostAlloc) and device memory, per direction ("h2d", "d2h",
// each a GB/s summary over ctx.reps), so that the kernel's figures sit
// beside it in the same run. On failure the section has "error" (also added
// to ctx.errors).
void RunCopyCeiling(BenchContext& ctx, uint64_t bytes, JsonWriter& json);

}  // namespace hicache::bench
