#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/kv_layout.h"

namespace hicache {

// Row sizes of the NSA / MLA payloads (bytes per token per layer).
inline constexpr uint32_t kMlaBf16RowBytes = 1152;  // 512 + 64 bf16 values.
inline constexpr uint32_t kMlaFp8RowBytes = 656;  // 512 fp8 + 4 fp32 + 64 bf16.
inline constexpr uint32_t kIndexerKRowBytes = 132;  // 128 fp8 + 1 fp32.

// How the target and draft payloads share one per-rank host byte budget.
// A host page holds the target and the draft payload of the same P tokens,
// so both hold exactly `tokens` tokens: the draft never gets more tokens
// than the target, however small its rows (see docs/operations.md, "Host
// memory").
struct HostBudget {
  int64_t pages = 0;          // Host pages per rank (each holds all families).
  uint64_t target_bytes = 0;  // pages * target bytes per page.
  uint64_t draft_bytes = 0;   // pages * draft bytes per page.
  uint64_t budget_bytes = 0;  // The budget split (per rank).
  int64_t tokens = 0;         // pages * P, for the target and the draft.
  // budget_bytes - target_bytes - draft_bytes: less than one page.
  uint64_t unused_bytes = 0;
};

// KV byte geometry of one model: page size and payload families. Immutable.
//
// Byte addresses (all within one rank's pool of `num_pages` physical pages):
//  * Device pool and layer-first host pool: one region per (family, layer),
//    families in order, layers in order inside a family; inside a region,
//    page p starts at p * P * row.
//  * Page-first host pool: page p starts at p * BytesPerPage(); inside it the
//    (family, layer) blocks of P * row bytes follow in the same order.
// A host page holds the target *and* draft payload of its tokens, so draft KV
// is reserved, copied and evicted in lockstep with target KV, and the host
// budget is split by bytes per token rather than given to each in full.
class KvGeometry {
 public:
  // INVALID_ARGUMENT for a page size that is not a power of two, no families,
  // an empty or repeated family name, a row that is not a positive multiple
  // of 4, or a family with no layers.
  static absl::StatusOr<KvGeometry> Create(uint32_t page_size,
                                           std::vector<KvFamily> families,
                                           std::string name = "custom");

  // Named presets. Model presets are one worker's whole KV at tensor
  // parallelism 1, with sizes from the models' published configurations
  // (bf16 K and V rows of kv_heads * head_dim * 2 bytes for MHA/GQA); for
  // TP > 1, another dtype or another model, describe it in a layout file
  // (ParseKvLayout, --kv_layout_file):
  //   "deepseek-v3.2"       61 layers MLA bf16 + indexer K, 1 draft layer of
  //                         each
  //   "deepseek-v3.2-fp8"   the same with FP8-packed MLA rows (656 B)
  //   "llama-3-8b"          32 layers, 8 KV heads of 128: K and V 2 KiB rows
  //   "llama-3-70b"         80 layers, 8 KV heads of 128
  //   "qwen3-8b"            36 layers, 8 KV heads of 128
  //   "qwen3-32b"           64 layers, 8 KV heads of 128
  //   "qwen3-30b-a3b"       48 layers, 4 KV heads of 128 (MoE)
  //   "qwen3-235b-a22b"     94 layers, 4 KV heads of 128 (MoE)
  //   "glm-4-9b"            40 layers, 2 KV heads of 128
  //   "glm-4.5"             92 layers, 8 KV heads of 128 (MoE)
  //   "mistral-7b"          32 layers, 8 KV heads of 128
  //   "micro"               1 layer of 4-byte rows (cache simulations)
  //   "tiny"                2 layers of 16-byte rows (tests)
  //   "tiny-draft"          "tiny" plus a 1-layer draft family (tests)
  static absl::StatusOr<KvGeometry> Preset(absl::string_view name,
                                           uint32_t page_size = 64);
  static std::vector<std::string> PresetNames();
  // The layout a daemon runs: `families` under `name` when there are any
  // (a layout file), else the preset `name`.
  static absl::StatusOr<KvGeometry> Resolve(
      absl::string_view name, const std::vector<KvFamily>& families,
      uint32_t page_size);
  static absl::StatusOr<KvGeometry> OfConfig(const DaemonConfig& config) {
    return Resolve(config.kv_preset, config.kv_families, config.page_size);
  }

  uint32_t page_size() const { return page_size_; }
  const std::vector<KvFamily>& families() const { return families_; }
  // Index of the family called `name`, or NOT_FOUND.
  absl::StatusOr<int> FamilyIndex(absl::string_view name) const;

  uint64_t BytesPerToken() const {
    return target_bytes_per_token_ + draft_bytes_per_token_;
  }
  uint64_t TargetBytesPerToken() const { return target_bytes_per_token_; }
  uint64_t DraftBytesPerToken() const { return draft_bytes_per_token_; }
  uint64_t BytesPerPage() const { return BytesPerToken() * page_size_; }
  // Bytes of one (family, layer) block of one page: P * row.
  uint64_t BlockBytes(int family) const {
    return uint64_t{families_[family].bytes_per_token} * page_size_;
  }

  // Bytes of a pool of `num_pages` pages (any layout).
  uint64_t PoolBytes(int64_t num_pages) const {
    return BytesPerPage() * static_cast<uint64_t>(num_pages);
  }

  // Byte offset of (page, family, layer). REQUIRES: 0 <= page < num_pages,
  // family and layer in range (see CheckAddress).
  uint64_t DeviceOffset(int64_t num_pages, int64_t page, int family,
                        uint32_t layer) const;
  uint64_t HostOffset(HostLayout layout, int64_t num_pages, int64_t page,
                      int family, uint32_t layer) const;
  // Byte distance between consecutive pages of one (family, layer) block run:
  // BlockBytes for region layouts, BytesPerPage for page-first.
  uint64_t PageStride(HostLayout layout, int family) const;

  // Transfer steps: one per layer. Steps [0, L) are layer s of every target
  // family (L = their largest layer count), steps [L, L + D) layer s - L of
  // every draft family. A family without that layer is skipped.
  uint32_t NumSteps() const { return target_layers_ + draft_layers_; }
  uint32_t TargetSteps() const { return target_layers_; }
  // The (family, layer) blocks a step copies.
  std::vector<std::pair<int, uint32_t>> StepBlocks(uint32_t step) const;

  // INVALID_ARGUMENT naming the bad field.
  absl::Status CheckAddress(int64_t num_pages, int64_t page, int family,
                            uint32_t layer) const;

  // Host pages per rank for a byte budget shared by target and draft: as
  // many whole pages as fit, each holding both payloads.
  HostBudget SplitHostBudget(uint64_t bytes_per_rank) const;
  // The budget of exactly `pages` host pages (no unused bytes).
  HostBudget HostBudgetOfPages(int64_t pages) const;

  // Fingerprint of everything that gives a host pool's bytes their meaning:
  // the page size, every family in order (name, bytes per token, layers,
  // draft), the host layout, the host pages per rank and the
  // context-parallel size. XXH3-64 of a versioned encoding of fixed-width
  // little-endian fields and length-prefixed names, so it is the same on
  // every machine and build. Two pools with equal fingerprints read the same
  // bytes the same way; any change of those inputs changes it (up to a 2^-64
  // collision). The geometry's name() is not part of it: it labels, the
  // families define. A persistent host segment carries it in its name
  // (ShmPool::PersistentHostName), so a restart with another geometry never
  // attaches an old segment.
  uint64_t HostFingerprint(HostLayout layout, int64_t host_pages_per_rank,
                           uint32_t cp_size) const;

  const std::string& name() const { return name_; }
  // e.g. "deepseek-v3.2-fp8: P=64, 3126784 B/page (target 48068 B/token,
  // draft 788 B/token), families mla_fp8x61 indexer_kx61 ...".
  std::string Describe() const;

 private:
  KvGeometry(uint32_t page_size, std::vector<KvFamily> families,
             std::string name);

  // Offset of block (family, layer) within a page of the page-first layout,
  // and the region index of (family, layer) in region layouts.
  uint64_t InPageOffset(int family, uint32_t layer) const {
    return (family_block_prefix_[family] +
            layer * uint64_t{families_[family].bytes_per_token}) *
           page_size_;
  }

  uint32_t page_size_;
  std::vector<KvFamily> families_;
  // Sum of rows * layers of families before f (bytes per token).
  std::vector<uint64_t> family_block_prefix_;
  uint32_t target_layers_ = 0;
  uint32_t draft_layers_ = 0;
  uint64_t target_bytes_per_token_ = 0;
  uint64_t draft_bytes_per_token_ = 0;
  std::string name_;
};

}  // namespace hicache
