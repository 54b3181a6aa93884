#include "daemon/pool/kv_geometry.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

TEST(KvGeometryTest, DeepSeekPresets) {
  auto fp8 = *KvGeometry::Preset("deepseek-v3.2-fp8");
  EXPECT_EQ(fp8.TargetBytesPerToken(), (656u + 132u) * 61u);  // 48068
  EXPECT_EQ(fp8.DraftBytesPerToken(), 656u + 132u);
  EXPECT_EQ(fp8.BytesPerPage(), (48068u + 788u) * 64u);
  auto bf16 = *KvGeometry::Preset("deepseek-v3.2");
  EXPECT_EQ(bf16.TargetBytesPerToken(), (1152u + 132u) * 61u);
  EXPECT_EQ(bf16.families().size(), 4u);
  EXPECT_TRUE(bf16.families()[2].draft);
  EXPECT_THAT(fp8.Describe(), HasSubstr("mla_fp8=656Bx61"));
  EXPECT_THAT(KvGeometry::Preset("llama").status().message(),
              HasSubstr("known: deepseek-v3.2"));
  EXPECT_EQ(*fp8.FamilyIndex("indexer_k"), 1);
  EXPECT_EQ(fp8.FamilyIndex("nope").status().code(),
            absl::StatusCode::kNotFound);
}

// MHA/GQA presets: K and V rows of kv_heads * head_dim * 2 bytes (bf16) in
// every layer, from each model's published configuration.
TEST(KvGeometryTest, ModelPresetsHaveKAndVOfTheirHeads) {
  struct Model {
    const char* name;
    uint32_t layers;
    uint32_t kv_heads;
  };
  for (const Model& m : {Model{"llama-3-8b", 32, 8}, Model{"llama-3-70b", 80, 8},
                         Model{"qwen3-8b", 36, 8}, Model{"qwen3-32b", 64, 8},
                         Model{"qwen3-30b-a3b", 48, 4},
                         Model{"qwen3-235b-a22b", 94, 4},
                         Model{"glm-4-9b", 40, 2}, Model{"glm-4.5", 92, 8},
                         Model{"mistral-7b", 32, 8}}) {
    absl::StatusOr<KvGeometry> g = KvGeometry::Preset(m.name, 16);
    ASSERT_TRUE(g.ok()) << m.name << ": " << g.status();
    const uint32_t row = m.kv_heads * 128 * 2;
    EXPECT_EQ(g->families(), (std::vector<KvFamily>{{"k", row, m.layers, false},
                                                    {"v", row, m.layers, false}}))
        << m.name;
    EXPECT_EQ(g->TargetBytesPerToken(), 2ull * row * m.layers) << m.name;
    EXPECT_EQ(g->NumSteps(), m.layers) << m.name;
    EXPECT_EQ(g->name(), m.name);
  }
  // Llama 3 8B: 128 KiB of KV a token.
  EXPECT_EQ(KvGeometry::Preset("llama-3-8b")->TargetBytesPerToken(), 131072u);
  // Every listed preset exists, and the error lists them.
  for (const std::string& name : KvGeometry::PresetNames()) {
    EXPECT_TRUE(KvGeometry::Preset(name).ok()) << name;
  }
  EXPECT_THAT(KvGeometry::Preset("llama").status().message(),
              HasSubstr("llama-3-8b, llama-3-70b"));
}

// A layout file's families under its name; no families: the preset.
TEST(KvGeometryTest, ResolveTakesFamiliesOverThePresetName) {
  const std::vector<KvFamily> families = {{"k", 64, 2, false},
                                          {"v", 64, 2, false}};
  absl::StatusOr<KvGeometry> g = KvGeometry::Resolve("mine", families, 16);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->name(), "mine");
  EXPECT_EQ(g->families(), families);
  EXPECT_EQ(KvGeometry::Resolve("tiny", {}, 16)->families(),
            KvGeometry::Preset("tiny", 16)->families());
  EXPECT_THAT(KvGeometry::Resolve("x", {{"k", 6, 1, false}}, 16)
                  .status()
                  .message(),
              HasSubstr("multiple of 4"));
  DaemonConfig config;
  config.kv_preset = "mine";
  config.kv_families = families;
  config.page_size = 16;
  EXPECT_EQ(KvGeometry::OfConfig(config)->families(), families);
}

TEST(KvGeometryTest, RejectsBadFamilies) {
  EXPECT_THAT(KvGeometry::Create(64, {}).status().message(),
              HasSubstr("needs a payload family"));
  EXPECT_THAT(KvGeometry::Create(64, {{"a", 6, 1}}).status().message(),
              HasSubstr("multiple of 4"));
  EXPECT_THAT(KvGeometry::Create(64, {{"a", 8, 0}}).status().message(),
              HasSubstr("num_layers"));
  EXPECT_THAT(
      KvGeometry::Create(64, {{"a", 8, 1}, {"a", 8, 1}}).status().message(),
      HasSubstr("unique"));
  EXPECT_FALSE(KvGeometry::Create(48, {{"a", 8, 1}}).ok());
}

// Every (page, family, layer) block, in every layout, lies inside the pool
// and no two blocks overlap: the blocks tile the pool exactly.
TEST(KvGeometryTest, BlocksTileThePoolInEveryLayout) {
  auto geometry = *KvGeometry::Create(
      4, {{"a", 8, 3}, {"b", 12, 2}, {"d", 4, 1, true}}, "mixed");
  constexpr int64_t kPages = 7;
  for (int layout = 0; layout < 3; ++layout) {
    std::vector<std::pair<uint64_t, uint64_t>> blocks;  // (offset, bytes)
    for (int64_t page = 0; page < kPages; ++page) {
      for (int f = 0; f < 3; ++f) {
        for (uint32_t l = 0; l < geometry.families()[f].num_layers; ++l) {
          ASSERT_TRUE(geometry.CheckAddress(kPages, page, f, l).ok());
          const uint64_t offset =
              layout == 0
                  ? geometry.DeviceOffset(kPages, page, f, l)
                  : geometry.HostOffset(layout == 1 ? HostLayout::kLayerFirst
                                                    : HostLayout::kPageFirst,
                                        kPages, page, f, l);
          blocks.push_back({offset, geometry.BlockBytes(f)});
        }
      }
    }
    std::sort(blocks.begin(), blocks.end());
    uint64_t next = 0;
    for (const auto& [offset, bytes] : blocks) {
      ASSERT_EQ(offset, next) << "layout " << layout;
      next += bytes;
    }
    EXPECT_EQ(next, geometry.PoolBytes(kPages));
  }
}

TEST(KvGeometryTest, PageFirstKeepsAPageContiguous) {
  auto g = *KvGeometry::Preset("tiny-draft", 4);
  // Page 3 of a page-first pool: [3 * page bytes, 4 * page bytes).
  EXPECT_EQ(g.HostOffset(HostLayout::kPageFirst, 10, 3, 0, 0),
            3 * g.BytesPerPage());
  EXPECT_EQ(g.HostOffset(HostLayout::kPageFirst, 10, 3, 1, 0),
            3 * g.BytesPerPage() + 2 * 16 * 4);
  EXPECT_EQ(g.PageStride(HostLayout::kPageFirst, 0), g.BytesPerPage());
  EXPECT_EQ(g.PageStride(HostLayout::kLayerFirst, 0), 64u);
  // Layer-first: consecutive pages of one layer are adjacent.
  EXPECT_EQ(g.HostOffset(HostLayout::kLayerFirst, 10, 4, 0, 1) -
                g.HostOffset(HostLayout::kLayerFirst, 10, 3, 0, 1),
            64u);
}

TEST(KvGeometryTest, CheckAddressNamesTheField) {
  auto g = *KvGeometry::Preset("tiny");
  EXPECT_THAT(g.CheckAddress(10, 10, 0, 0).message(), HasSubstr("page 10"));
  EXPECT_THAT(g.CheckAddress(10, 0, 1, 0).message(), HasSubstr("family 1"));
  EXPECT_THAT(g.CheckAddress(10, 0, 0, 2).message(), HasSubstr("layer 2"));
  EXPECT_FALSE(g.CheckAddress(10, -1, 0, 0).ok());
}

TEST(KvGeometryTest, HostBudgetIsSharedNotDoubled) {
  auto g = *KvGeometry::Preset("deepseek-v3.2-fp8");
  const uint64_t budget = uint64_t{220} << 30;  // 220 GiB per rank.
  HostBudget split = g.SplitHostBudget(budget);
  EXPECT_EQ(split.pages, static_cast<int64_t>(budget / g.BytesPerPage()));
  EXPECT_LE(split.target_bytes + split.draft_bytes, budget);
  EXPECT_GT(split.target_bytes + split.draft_bytes, budget - g.BytesPerPage());
  // The split follows bytes per token: draft / target = 788 / 48068.
  EXPECT_EQ(split.draft_bytes * 48068, split.target_bytes * 788);
  EXPECT_EQ(g.SplitHostBudget(g.BytesPerPage() - 1).pages, 0);
}

// Every input that gives host bytes their meaning changes the fingerprint;
// the geometry's label does not.
TEST(KvGeometryTest, HostFingerprintCoversEveryInput) {
  const std::vector<KvFamily> base_families = {
      {"kv", 16, 2, false}, {"draft_kv", 8, 1, true}};
  auto make = [](uint32_t page_size, std::vector<KvFamily> families) {
    auto g = KvGeometry::Create(page_size, std::move(families), "x");
    EXPECT_TRUE(g.ok()) << g.status();
    return *g;
  };
  const KvGeometry base = make(64, base_families);
  const uint64_t fp = base.HostFingerprint(HostLayout::kLayerFirst, 1000, 1);
  // Deterministic, and the label is not part of it.
  EXPECT_EQ(fp, base.HostFingerprint(HostLayout::kLayerFirst, 1000, 1));
  EXPECT_EQ(fp, KvGeometry::Create(64, base_families, "other-name")
                    ->HostFingerprint(HostLayout::kLayerFirst, 1000, 1));

  std::vector<uint64_t> variants;
  auto with_family = [&](auto change) {
    std::vector<KvFamily> families = base_families;
    change(families);
    return make(64, families).HostFingerprint(HostLayout::kLayerFirst, 1000,
                                              1);
  };
  variants.push_back(
      make(32, base_families).HostFingerprint(HostLayout::kLayerFirst, 1000, 1));
  variants.push_back(with_family([](auto& f) { f[0].name = "kv2"; }));
  variants.push_back(with_family([](auto& f) { f[0].bytes_per_token = 20; }));
  variants.push_back(with_family([](auto& f) { f[0].num_layers = 3; }));
  variants.push_back(with_family([](auto& f) { f[1].draft = false; }));
  variants.push_back(with_family([](auto& f) { std::swap(f[0], f[1]); }));
  variants.push_back(with_family([](auto& f) { f.pop_back(); }));
  variants.push_back(
      with_family([](auto& f) { f.push_back({"extra", 4, 1, false}); }));
  // Name boundaries are length-prefixed: "ab"+"c" is not "a"+"bc".
  variants.push_back(with_family([](auto& f) {
    f[0].name = "draft_";
    f[1].name = "kv";
  }));
  variants.push_back(base.HostFingerprint(HostLayout::kPageFirst, 1000, 1));
  variants.push_back(base.HostFingerprint(HostLayout::kLayerFirst, 1001, 1));
  variants.push_back(base.HostFingerprint(HostLayout::kLayerFirst, 1000, 4));
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(variants[i], fp) << "variant " << i;
    for (size_t j = 0; j < i; ++j) {
      EXPECT_NE(variants[i], variants[j]) << i << " vs " << j;
    }
  }
}

// Persistent segments are named after the fingerprint, so a new build that
// changed the encoding would start cold after an upgrade. This value may
// change only on purpose (bump the "-v1" version string with it).
TEST(KvGeometryTest, HostFingerprintIsStableAcrossBuilds) {
  auto fp8 = *KvGeometry::Preset("deepseek-v3.2-fp8", 64);
  EXPECT_EQ(fp8.HostFingerprint(HostLayout::kLayerFirst, 1000, 4),
            uint64_t{0x0e43dacbd8257a54});
}

}  // namespace
}  // namespace hicache
