#pragma once

// What a model's KV cache looks like, as data: payload families of rows
// (KvFamily) under a name. Presets for common models and a layout file
// (--kv_layout_file) both describe one; KvGeometry (daemon/pool) turns it
// into byte addresses and checks the sizes.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace hicache {

// One KV payload family: `bytes_per_token` bytes per token in each of
// `num_layers` layers (a row). MLA has one family per layer stack (the
// latent plus RoPE); MHA and GQA have two, K and V.
struct KvFamily {
  std::string name;
  uint32_t bytes_per_token = 0;  // Row size; a positive multiple of 4.
  uint32_t num_layers = 0;
  bool draft = false;  // Part of the draft (MTP) payload.

  bool operator==(const KvFamily&) const = default;
};

struct KvLayout {
  std::string name;
  std::vector<KvFamily> families;
};

// Bytes of one element of a KV dtype: "bf16", "fp16" (2), "fp8" (1),
// "fp32" (4); INVALID_ARGUMENT for anything else.
absl::StatusOr<uint32_t> KvDtypeBytes(absl::string_view dtype);

// The K and V families ("k", "v", or "<prefix>k", "<prefix>v") of a
// multi-head or grouped-query attention stack: each row is
// kv_heads * head_dim * dtype_bytes. INVALID_ARGUMENT for a zero or
// overflowing size (KvGeometry checks the rest).
absl::StatusOr<std::vector<KvFamily>> AttentionFamilies(
    uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
    uint32_t dtype_bytes, bool draft = false, absl::string_view prefix = "");

// A layout from a JSON description (docs/kv-layouts.md):
//
//   {"name": "llama-3-8b-tp2",
//    "attention": {"layers": 32, "kv_heads": 8, "head_dim": 128,
//                  "dtype": "bf16", "tp_size": 2}}
//
// or families given row by row:
//
//   {"name": "my-model",
//    "families": [{"name": "k", "bytes_per_token": 1024, "layers": 32},
//                 {"name": "v", "bytes_per_token": 1024, "layers": 32},
//                 {"name": "draft_kv", "bytes_per_token": 512, "layers": 1,
//                  "draft": true}]}
//
// "attention" and "families" may both be given (the attention families
// first). With "tp_size" T a worker holds ceil(kv_heads / T) heads (a head
// is replicated when T exceeds kv_heads). The name is 1 to 64 characters of
// [A-Za-z0-9._-]. Unknown keys, wrong types, negative or fractional numbers
// and values above 2^32 - 1 are INVALID_ARGUMENT naming the key.
absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view json);

// ParseKvLayout of a file's contents (at most 1 MiB); NOT_FOUND or
// PERMISSION_DENIED naming the path when it cannot be read, and parse
// errors prefixed with the path.
absl::StatusOr<KvLayout> ReadKvLayoutFile(const std::string& path);

}  // namespace hicache
