#include "daemon/pool/kv_geometry.h"

#include <xxhash.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/le_bytes.h"

namespace hicache {

absl::StatusOr<KvGeometry> KvGeometry::Create(uint32_t page_size,
                                              std::vector<KvFamily> families,
                                              std::string name) {
  if (page_size == 0 || (page_size & (page_size - 1)) != 0 ||
      page_size > (1u << 16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size must be a power of two in [1, 65536], got ", page_size));
  }
  if (families.empty()) {
    return absl::InvalidArgumentError("a KV geometry needs a payload family");
  }
  std::set<std::string> names;
  for (const KvFamily& f : families) {
    if (f.name.empty() || !names.insert(f.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV family names must be non-empty and unique, got '", f.name, "'"));
    }
    if (f.bytes_per_token == 0 || f.bytes_per_token % 4 != 0 ||
        f.bytes_per_token > (1u << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV family '", f.name,
                       "': bytes_per_token must be a positive multiple of 4 "
                       "up to 1 MiB, got ",
                       f.bytes_per_token));
    }
    if (f.num_layers == 0 || f.num_layers > 4096) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV family '", f.name, "': num_layers must be in [1, 4096], got ",
          f.num_layers));
    }
  }
  return KvGeometry(page_size, std::move(families), std::move(name));
}

KvGeometry::KvGeometry(uint32_t page_size, std::vector<KvFamily> families,
                       std::string name)
    : page_size_(page_size),
      families_(std::move(families)),
      name_(std::move(name)) {
  uint64_t prefix = 0;
  for (const KvFamily& f : families_) {
    family_block_prefix_.push_back(prefix);
    const uint64_t bytes = uint64_t{f.bytes_per_token} * f.num_layers;
    prefix += bytes;
    (f.draft ? draft_bytes_per_token_ : target_bytes_per_token_) += bytes;
    uint32_t& layers = f.draft ? draft_layers_ : target_layers_;
    layers = std::max(layers, f.num_layers);
  }
}

std::vector<std::pair<int, uint32_t>> KvGeometry::StepBlocks(
    uint32_t step) const {
  std::vector<std::pair<int, uint32_t>> blocks;
  const bool draft = step >= target_layers_;
  const uint32_t layer = draft ? step - target_layers_ : step;
  for (size_t f = 0; f < families_.size(); ++f) {
    if (families_[f].draft == draft && layer < families_[f].num_layers) {
      blocks.push_back({static_cast<int>(f), layer});
    }
  }
  return blocks;
}

absl::StatusOr<KvGeometry> KvGeometry::Preset(absl::string_view name,
                                              uint32_t page_size) {
  auto deepseek = [&](uint32_t mla_row, const char* mla_name) {
    return Create(page_size,
                  {
                      {mla_name, mla_row, 61, false},
                      {"indexer_k", kIndexerKRowBytes, 61, false},
                      {absl::StrCat("draft_", mla_name), mla_row, 1, true},
                      {"draft_indexer_k", kIndexerKRowBytes, 1, true},
                  },
                  std::string(name));
  };
  if (name == "deepseek-v3.2") return deepseek(kMlaBf16RowBytes, "mla_bf16");
  if (name == "deepseek-v3.2-fp8") return deepseek(kMlaFp8RowBytes, "mla_fp8");
  // Grouped-query attention, bf16 K and V rows of heads * 128 * 2 bytes.
  auto gqa = [&](uint32_t layers,
                 uint32_t kv_heads) -> absl::StatusOr<KvGeometry> {
    absl::StatusOr<std::vector<KvFamily>> families =
        AttentionFamilies(layers, kv_heads, /*head_dim=*/128, /*bf16*/ 2);
    if (!families.ok()) return families.status();
    return Create(page_size, *std::move(families), std::string(name));
  };
  if (name == "llama-3-8b") return gqa(32, 8);
  if (name == "llama-3-70b") return gqa(80, 8);
  if (name == "qwen3-8b") return gqa(36, 8);
  if (name == "qwen3-32b") return gqa(64, 8);
  if (name == "qwen3-30b-a3b") return gqa(48, 4);
  if (name == "qwen3-235b-a22b") return gqa(94, 4);
  if (name == "glm-4-9b") return gqa(40, 2);
  if (name == "glm-4.5") return gqa(92, 8);
  if (name == "mistral-7b") return gqa(32, 8);
  if (name == "micro") {  // Cache simulations: bytes barely matter.
    return Create(page_size, {{"kv", 4, 1, false}}, "micro");
  }
  if (name == "tiny") {
    return Create(page_size, {{"kv", 16, 2, false}}, "tiny");
  }
  if (name == "tiny-draft") {
    return Create(page_size, {{"kv", 16, 2, false}, {"draft_kv", 8, 1, true}},
                  "tiny-draft");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV preset '", name,
                   "'; known: ", absl::StrJoin(PresetNames(), ", ")));
}

std::vector<std::string> KvGeometry::PresetNames() {
  return {"deepseek-v3.2", "deepseek-v3.2-fp8", "llama-3-8b",
          "llama-3-70b",   "qwen3-8b",          "qwen3-32b",
          "qwen3-30b-a3b", "qwen3-235b-a22b",   "glm-4-9b",
          "glm-4.5",       "mistral-7b",        "micro",
          "tiny",          "tiny-draft"};
}

absl::StatusOr<KvGeometry> KvGeometry::Resolve(
    absl::string_view name, const std::vector<KvFamily>& families,
    uint32_t page_size) {
  if (families.empty()) return Preset(name, page_size);
  return Create(page_size, families, std::string(name));
}

absl::StatusOr<int> KvGeometry::FamilyIndex(absl::string_view name) const {
  for (size_t i = 0; i < families_.size(); ++i) {
    if (families_[i].name == name) return static_cast<int>(i);
  }
  return absl::NotFoundError(
      absl::StrCat("no KV family '", name, "' in ", name_));
}

uint64_t KvGeometry::DeviceOffset(int64_t num_pages, int64_t page, int family,
                                  uint32_t layer) const {
  return static_cast<uint64_t>(num_pages) * InPageOffset(family, layer) +
         static_cast<uint64_t>(page) * BlockBytes(family);
}

uint64_t KvGeometry::HostOffset(HostLayout layout, int64_t num_pages,
                                int64_t page, int family,
                                uint32_t layer) const {
  if (layout == HostLayout::kPageFirst) {
    return static_cast<uint64_t>(page) * BytesPerPage() +
           InPageOffset(family, layer);
  }
  return DeviceOffset(num_pages, page, family, layer);
}

uint64_t KvGeometry::PageStride(HostLayout layout, int family) const {
  return layout == HostLayout::kPageFirst ? BytesPerPage() : BlockBytes(family);
}

absl::Status KvGeometry::CheckAddress(int64_t num_pages, int64_t page,
                                      int family, uint32_t layer) const {
  if (page < 0 || page >= num_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page ", page, " is outside the pool's [0, ", num_pages, ")"));
  }
  if (family < 0 || family >= static_cast<int>(families_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "family ", family, " is outside [0, ", families_.size(), ")"));
  }
  if (layer >= families_[family].num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", layer, " is outside family '", families_[family].name,
        "' with ", families_[family].num_layers, " layers"));
  }
  return absl::OkStatus();
}

HostBudget KvGeometry::SplitHostBudget(uint64_t bytes_per_rank) const {
  HostBudget budget =
      HostBudgetOfPages(static_cast<int64_t>(bytes_per_rank / BytesPerPage()));
  budget.budget_bytes = bytes_per_rank;
  budget.unused_bytes =
      bytes_per_rank - budget.target_bytes - budget.draft_bytes;
  return budget;
}

HostBudget KvGeometry::HostBudgetOfPages(int64_t pages) const {
  HostBudget budget;
  budget.pages = pages;
  budget.tokens = pages * page_size_;
  budget.target_bytes = pages * TargetBytesPerToken() * page_size_;
  budget.draft_bytes = pages * DraftBytesPerToken() * page_size_;
  budget.budget_bytes = budget.target_bytes + budget.draft_bytes;
  return budget;
}

uint64_t KvGeometry::HostFingerprint(HostLayout layout,
                                     int64_t host_pages_per_rank,
                                     uint32_t cp_size) const {
  // Fixed-width little-endian fields; strings are a u64 length, then the
  // bytes.
  std::string bytes;
  LeWriter e(&bytes);
  auto str = [&e](absl::string_view s) {
    e.U64(s.size());
    e.Bytes(s);
  };
  str("hicache-host-geometry-v1");
  e.U64(page_size_);
  e.U64(families_.size());
  for (const KvFamily& f : families_) {
    str(f.name);
    e.U64(f.bytes_per_token);
    e.U64(f.num_layers);
    e.U64(f.draft ? 1 : 0);
  }
  // The layout's flag spelling, not the enum's value: stable if the enum
  // grows.
  str(HostLayoutName(layout));
  e.U64(static_cast<uint64_t>(host_pages_per_rank));
  e.U64(cp_size);
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string KvGeometry::Describe() const {
  std::vector<std::string> parts;
  for (const KvFamily& f : families_) {
    parts.push_back(
        absl::StrCat(f.name, "=", f.bytes_per_token, "Bx", f.num_layers));
  }
  return absl::StrCat(name_, ": P=", page_size_, ", ", BytesPerPage(),
                      " B/page (target ", TargetBytesPerToken(),
                      " B/token, draft ", DraftBytesPerToken(), " B/token); ",
                      absl::StrJoin(parts, " "));
}

}  // namespace hicache
