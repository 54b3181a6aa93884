#include "daemon/pool/host_budget.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

DaemonConfig ConfigWithBudget(absl::string_view preset, uint32_t page_size,
                              uint64_t bytes) {
  DaemonConfig config;
  config.kv_preset = std::string(preset);
  config.page_size = page_size;
  config.host_bytes_per_rank = bytes;
  return config;
}

// "tiny-draft" at P = 4: target 2 layers x 16 B = 32 B/token, draft 1 layer
// x 8 B = 8 B/token: a page is 4 x 40 = 160 bytes.
TEST(HostBudgetTest, OneByteBudgetSizesBothPayloads) {
  DaemonConfig config = ConfigWithBudget("tiny-draft", 4, 160 * 100 + 159);
  absl::StatusOr<HostBudget> budget = ResolveHostPages(&config);
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(budget->pages, 100);
  EXPECT_EQ(config.host_pages_per_rank, 100u);
  EXPECT_EQ(budget->budget_bytes, 160u * 100 + 159);
  EXPECT_EQ(budget->target_bytes, 100u * 4 * 32);
  EXPECT_EQ(budget->draft_bytes, 100u * 4 * 8);
  EXPECT_EQ(budget->unused_bytes, 159u);
  EXPECT_EQ(budget->tokens, 400);
  EXPECT_EQ(budget->target_bytes + budget->draft_bytes + budget->unused_bytes,
            budget->budget_bytes);
  EXPECT_TRUE(config.Validate().ok());
  // Resolving again changes nothing.
  absl::StatusOr<HostBudget> again = ResolveHostPages(&config);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pages, 100);
  EXPECT_EQ(config.host_pages_per_rank, 100u);
}

// The draft's rows are smaller than the target's (1/61 of the bytes per
// token for DeepSeek V3.2), yet it never gets more tokens: a host page holds
// both payloads of the same tokens, because a draft without its target KV
// can never be hit.
TEST(HostBudgetTest, TheDraftNeverGetsMoreTokensThanTheTarget) {
  for (const std::string& preset : KvGeometry::PresetNames()) {
    for (uint32_t page_size : {1u, 16u, 64u}) {
      const KvGeometry g = *KvGeometry::Preset(preset, page_size);
      for (uint64_t bytes : {g.BytesPerPage(), 3 * g.BytesPerPage() - 1,
                             uint64_t{1} << 30, uint64_t{220} << 30}) {
        const HostBudget b = g.SplitHostBudget(bytes);
        const std::string where =
            absl::StrCat(preset, " P=", page_size, " bytes=", bytes);
        // Both payloads hold exactly b.tokens tokens: bytes / bytes-per-token.
        EXPECT_EQ(b.target_bytes, b.tokens * g.TargetBytesPerToken()) << where;
        EXPECT_EQ(b.draft_bytes, b.tokens * g.DraftBytesPerToken()) << where;
        EXPECT_EQ(b.tokens, b.pages * page_size) << where;
        EXPECT_LE(b.target_bytes + b.draft_bytes, bytes) << where;
        EXPECT_LT(b.unused_bytes, g.BytesPerPage()) << where;
      }
    }
  }
}

TEST(HostBudgetTest, PagesSizeTheTierWithoutABudget) {
  DaemonConfig config;
  config.kv_preset = "tiny-draft";
  config.page_size = 4;
  config.host_pages_per_rank = 10;
  absl::StatusOr<HostBudget> budget = ResolveHostPages(&config);
  ASSERT_TRUE(budget.ok()) << budget.status();
  EXPECT_EQ(config.host_pages_per_rank, 10u);
  EXPECT_EQ(budget->pages, 10);
  EXPECT_EQ(budget->budget_bytes, 10u * 160);
  EXPECT_EQ(budget->unused_bytes, 0u);
  EXPECT_EQ(budget->tokens, 40);
}

TEST(HostBudgetTest, ABudgetBelowOnePageIsRefused) {
  DaemonConfig config = ConfigWithBudget("tiny-draft", 4, 159);
  absl::StatusOr<HostBudget> budget = ResolveHostPages(&config);
  EXPECT_EQ(budget.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(budget.status().message(),
              HasSubstr("host_bytes_per_rank = 159 holds no host page: a page "
                        "of tiny-draft at P = 4 takes 160 bytes (target 128 + "
                        "draft 32)"));
  EXPECT_EQ(config.host_pages_per_rank, 16384u);  // Untouched.
}

TEST(HostBudgetTest, GeometryErrorsPassThrough) {
  DaemonConfig config = ConfigWithBudget("llama", 64, 1 << 20);
  EXPECT_THAT(ResolveHostPages(&config).status().message(),
              HasSubstr("unknown KV preset 'llama'"));
  config = ConfigWithBudget("tiny", 48, 1 << 20);
  EXPECT_THAT(ResolveHostPages(&config).status().message(),
              HasSubstr("page_size must be a power of two"));
  config = DaemonConfig();
  config.host_pages_per_rank = DaemonConfig::kMaxPagesPerRank + 1;
  EXPECT_THAT(ResolveHostPages(&config).status().message(),
              HasSubstr("host_pages_per_rank must be at most"));
}

TEST(HostBudgetTest, DescribesTheSplit) {
  DaemonConfig config = ConfigWithBudget("tiny-draft", 4, 160 * 100 + 159);
  EXPECT_EQ(DescribeHostBudget(*HostBudgetOf(config)),
            "host tier per rank: budget 16159 bytes -> 100 pages of 160 "
            "bytes, 400 tokens each for target (12800 bytes) and draft (3200 "
            "bytes), 159 bytes unused");
}

}  // namespace
}  // namespace hicache
