// Per-namespace page quotas in the engine (docs/quotas.md): limits evict
// the namespace's own pages first and then refuse; guarantees hold against
// a flooding tenant. Run under the daemon's defaults (EngineOptions{}),
// at C = 1, 2 and 4, and under every write policy for the flood.
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/hicache_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kP = 4;
constexpr uint64_t kHolderA = 1;  // Tenant "a": the flooder.
constexpr uint64_t kHolderB = 2;  // Tenant "b": the one with a guarantee.

std::vector<int32_t> Seq(int32_t first, int n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::unique_ptr<HiCacheEngine> MakeEngine(EngineOptions options) {
  options.page_size = kP;
  options.kv_preset = "tiny-draft";
  options.write_ahead_thread = false;  // Rounds inline: counts are exact.
  auto engine = HiCacheEngine::Create(options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  (*engine)->BindHolder(kHolderA, "a");
  (*engine)->BindHolder(kHolderB, "b");
  return *std::move(engine);
}

// Caches `tokens` for `holder` in `ns` (allocate, insert); the pages the
// tree did not adopt are freed. Returns the allocation's status.
absl::Status CacheAs(HiCacheEngine& engine, uint64_t holder,
                     const std::string& ns, const std::vector<int32_t>& tokens) {
  const int64_t pages = (static_cast<int64_t>(tokens.size()) + kP - 1) / kP;
  absl::StatusOr<std::vector<LogicalPage>> got =
      engine.Allocate(pages, holder);
  if (!got.ok()) return got.status();
  absl::StatusOr<InsertResult> inserted =
      engine.Insert(ns, tokens, *got, {}, holder);
  if (!inserted.ok()) return inserted.status();
  engine.FreeAllOf(holder);
  engine.WaitForTransfers();
  return absl::OkStatus();
}

NamespaceQuotaUsage UsageOf(const HiCacheEngine& engine, const std::string& ns) {
  for (const NamespaceQuotaUsage& usage : engine.NamespaceQuotas()) {
    if (usage.quota.ns == ns) return usage;
  }
  return {};
}

TEST(NamespaceQuotaTest, DeviceLimitEvictsTheNamespacesOwnPagesFirst) {
  auto engine = MakeEngine({.device_pages_per_rank = 33});  // 32 usable.
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(
      engine->SetNamespaceQuota({.ns = "a", .device_limit = 8}).ok());
  ASSERT_TRUE(CacheAs(*engine, kHolderB, "b", Seq(1000, 40)).ok());  // 10.
  ASSERT_TRUE(CacheAs(*engine, kHolderA, "a", Seq(0, 16)).ok());     // 4.
  ASSERT_TRUE(CacheAs(*engine, kHolderA, "a", Seq(100, 16)).ok());   // 4.
  EXPECT_EQ(UsageOf(*engine, "a").device_cached_pages, 8);
  // 4 more pages for "a": the pool has room, its limit does not. Its own
  // nodes make the room; "b" keeps every page.
  absl::StatusOr<std::vector<LogicalPage>> more = engine->Allocate(4, kHolderA);
  ASSERT_TRUE(more.ok()) << more.status();
  const NamespaceQuotaUsage a = UsageOf(*engine, "a");
  EXPECT_EQ(a.device_request_pages, 4);
  EXPECT_LE(a.device_cached_pages + a.device_request_pages, 8);
  EXPECT_EQ(UsageOf(*engine, "b").device_cached_pages, 10);
  EXPECT_GE(engine->Stats().quota_evicted_pages, 4);
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
}

TEST(NamespaceQuotaTest, DeviceLimitRefusesWhatItsOwnPagesCannotCover) {
  auto engine = MakeEngine({.device_pages_per_rank = 33});
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(
      engine->SetNamespaceQuota({.ns = "a", .device_limit = 8}).ok());
  // Request pages cannot be evicted: at the limit, one more is refused
  // and nothing changes.
  ASSERT_TRUE(engine->Allocate(8, kHolderA).ok());
  absl::StatusOr<std::vector<LogicalPage>> over = engine->Allocate(1, kHolderA);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("device limit"));
  EXPECT_EQ(engine->RequestPages(kHolderA), 8);
  EXPECT_EQ(engine->Stats().quota_refusals, 1);
  // More than the limit at once: refused without evicting anything.
  engine->FreeAllOf(kHolderA);
  ASSERT_TRUE(CacheAs(*engine, kHolderA, "a", Seq(0, 16)).ok());
  EXPECT_EQ(engine->Allocate(9, kHolderA).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(UsageOf(*engine, "a").device_cached_pages, 4);
  // Other namespaces and unbound holders are not limited by it.
  EXPECT_TRUE(engine->Allocate(12, kHolderB).ok());
  EXPECT_TRUE(engine->Allocate(12, /*holder=*/0).ok());
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
}

TEST(NamespaceQuotaTest, SetQuotaRefusesBadQuotasAndChangesNothing) {
  auto engine = MakeEngine({.cp_size = 2, .device_pages_per_rank = 17,
                            .host_pages_per_rank = 20});
  ASSERT_NE(engine, nullptr);  // 32 device pages, 40 host pages.
  ASSERT_TRUE(engine->SetNamespaceQuota({.ns = "a", .device_guaranteed = 20})
                  .ok());
  for (const NamespaceQuota& bad : {
           NamespaceQuota{.ns = "b", .device_guaranteed = 13},  // 33 > 32.
           NamespaceQuota{.ns = "b", .host_guaranteed = 41},
           // Reproduction: summed with a's 20, INT64_MAX overflowed to a
           // negative total and was accepted.
           NamespaceQuota{.ns = "b",
                          .device_guaranteed =
                              std::numeric_limits<int64_t>::max()},
           NamespaceQuota{.ns = "b", .device_limit = -1},
           NamespaceQuota{.ns = "b", .device_limit = 4,
                          .device_guaranteed = 5},
           NamespaceQuota{.ns = "b", .host_limit = 4, .host_guaranteed = 5},
       }) {
    EXPECT_EQ(engine->SetNamespaceQuota(bad).code(),
              absl::StatusCode::kInvalidArgument)
        << FormatNamespaceQuota(bad);
  }
  EXPECT_EQ(UsageOf(*engine, "b").quota,
            (NamespaceQuota{.ns = "b"}));  // Bound holder, no quota.
  // Replacing "a"'s own guarantee is judged without its old one.
  EXPECT_TRUE(engine->SetNamespaceQuota({.ns = "a", .device_guaranteed = 32})
                  .ok());
  EXPECT_TRUE(engine->SetNamespaceQuota({.ns = "a"}).ok());  // Removed.
  EXPECT_EQ(UsageOf(*engine, "a").quota, (NamespaceQuota{.ns = "a"}));
}

TEST(NamespaceQuotaTest, QuotasFromOptionsApplyAtStartAndBadOnesRefuseIt) {
  auto engine = MakeEngine({.namespace_quotas = {{.ns = "a",
                                                   .device_limit = 8}}});
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(UsageOf(*engine, "a").quota.device_limit, 8);
  EngineOptions bad{.namespace_quotas = {{.ns = "a", .device_limit = -3}}};
  bad.page_size = kP;
  bad.kv_preset = "tiny-draft";
  EXPECT_EQ(HiCacheEngine::Create(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NamespaceQuotaTest, LoadOverTheDeviceLimitIsANamespaceQuotaMiss) {
  // write_through: the cached node gets a host copy at once.
  auto engine = MakeEngine({.device_pages_per_rank = 33,
                            .write_policy = WritePolicy::kWriteThrough});
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> tokens = Seq(0, 16);
  {
    auto pages = engine->Allocate(4, kHolderA);
    ASSERT_TRUE(pages.ok());
    auto ops = engine->PrepareBackups({BackupSpec{*pages, 16}}, kHolderA);
    ASSERT_TRUE(ops.ok() && (*ops)[0] != 0);
    ASSERT_TRUE(engine->StoreAllLayers((*ops)[0]).ok());
    auto inserted = engine->Insert("a", tokens, *pages, {}, kHolderA);
    ASSERT_TRUE(inserted.ok());
    ASSERT_TRUE(engine->AttachBackup((*ops)[0], inserted->node).ok());
    engine->WaitForTransfers();
  }
  // Push it to the host tier: an operator eviction of every device page.
  ASSERT_TRUE(engine->EvictPages({32}, {}).ok());
  ASSERT_EQ(UsageOf(*engine, "a").device_cached_pages, 0);
  // Its sessions hold the whole limit in requests: the load cannot fit.
  ASSERT_TRUE(
      engine->SetNamespaceQuota({.ns = "a", .device_limit = 6}).ok());
  ASSERT_TRUE(engine->Allocate(4, kHolderA).ok());
  absl::StatusOr<LoadResult> load = engine->LoadBack("a", tokens);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->op_id, 0u);
  EXPECT_EQ(load->miss, LoadMissReason::kNamespaceQuota);
  ASSERT_TRUE(engine->Unlock(load->node).ok());
  EXPECT_EQ(UsageOf(*engine, "a").host_pages, 4);  // Still loadable later.
  engine->FreeAllOf(kHolderA);
  absl::StatusOr<LoadResult> again = engine->LoadBack("a", tokens);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->op_id, 0u);
  engine->WaitForTransfers();
  ASSERT_TRUE(engine->FinishLoad(again->op_id).ok());
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
}

TEST(NamespaceQuotaTest, HostLimitKeepsTheNamespacesCopiesUnderIt) {
  auto engine = MakeEngine({.device_pages_per_rank = 33,
                            .write_policy = WritePolicy::kWriteThrough});
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(engine->SetNamespaceQuota({.ns = "a", .host_limit = 8}).ok());
  for (int i = 0; i < 7; ++i) {
    if (i == 6) {
      // Its copies are all of device nodes (write_through keeps both), which
      // host eviction cannot take: demote them, and the next backup makes
      // room from its own host-only copies.
      ASSERT_TRUE(engine->EvictPages({32}, {}).ok());
    }
    auto pages = engine->Allocate(4, kHolderA);
    ASSERT_TRUE(pages.ok());
    auto ops = engine->PrepareBackups({BackupSpec{*pages, 16}}, kHolderA);
    ASSERT_TRUE(ops.ok());
    if ((*ops)[0] != 0) ASSERT_TRUE(engine->StoreAllLayers((*ops)[0]).ok());
    auto inserted =
        engine->Insert("a", Seq(100 * i, 16), *pages, {}, kHolderA);
    ASSERT_TRUE(inserted.ok());
    if ((*ops)[0] != 0) {
      ASSERT_TRUE(engine->AttachBackup((*ops)[0], inserted->node).ok());
    }
    engine->FreeAllOf(kHolderA);
    engine->WaitForTransfers();
    EXPECT_LE(UsageOf(*engine, "a").host_pages, 8) << "request " << i;
  }
  // Two backups fit the limit; the next four found nothing of "a" to evict.
  EXPECT_EQ(engine->Stats().backups_skipped_quota, 4);
  EXPECT_GE(engine->Stats().quota_evicted_pages, 4);
  EXPECT_EQ(engine->Stats().backups_committed, 3);
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
}

// Isolated eviction: a namespace within its guarantee makes room from the
// namespaces over theirs first, even though its own nodes are older; only
// when nothing else is left does it lose its own.
TEST(NamespaceQuotaTest, ANamespaceOverItsShareLosesItsPagesFirst) {
  auto engine = MakeEngine({.device_pages_per_rank = 33,  // 32 usable.
                            .eviction_policy = EvictionPolicy::kLru});
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(
      engine->SetNamespaceQuota({.ns = "b", .device_guaranteed = 16}).ok());
  for (int i = 0; i < 3; ++i) {  // b: 12 pages, the oldest.
    ASSERT_TRUE(CacheAs(*engine, kHolderB, "b", Seq(1000 * (i + 1), 16)).ok());
  }
  for (int i = 0; i < 4; ++i) {  // a: 16 pages, newer.
    ASSERT_TRUE(CacheAs(*engine, kHolderA, "a", Seq(100 * i, 16)).ok());
  }
  // 8 pages for b: 4 are free, 4 come from a, none from b.
  ASSERT_TRUE(engine->Allocate(8, kHolderB).ok());
  EXPECT_EQ(UsageOf(*engine, "b").device_cached_pages, 12);
  EXPECT_EQ(UsageOf(*engine, "a").device_cached_pages, 12);
  // 20 more: a's 12 go first, then 8 of b's own.
  ASSERT_TRUE(engine->Allocate(20, kHolderB).ok());
  EXPECT_EQ(UsageOf(*engine, "a").device_cached_pages, 0);
  EXPECT_EQ(UsageOf(*engine, "b").device_cached_pages, 4);
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
}

// The adversarial case: tenant "a" floods the pool with new sequences; "b"
// has a device guarantee. Every write policy, C = 1, 2, 4.
class FloodTest : public ::testing::TestWithParam<
                      std::tuple<WritePolicy, uint32_t>> {};

TEST_P(FloodTest, AFloodingTenantCannotEvictAnotherBelowItsGuarantee) {
  const auto [policy, cp] = GetParam();
  const int64_t per_lane = 16;  // 15 usable.
  auto engine = MakeEngine({.cp_size = cp,
                            .device_pages_per_rank = per_lane + 1,
                            .host_pages_per_rank = 8 * per_lane,
                            .write_policy = policy});
  ASSERT_NE(engine, nullptr);
  const int64_t capacity = per_lane * cp;
  const int64_t guaranteed = capacity / 3;
  ASSERT_TRUE(engine
                  ->SetNamespaceQuota({.ns = "b",
                                       .device_guaranteed = guaranteed,
                                       .host_guaranteed = guaranteed})
                  .ok());
  // "b" caches a little over twice its guarantee, in requests of 2 pages
  // (up to twice, the flood's eviction spares its pages that have no host
  // copy while "a" has pages of its own: RadixTree::kUncopiedSparedUpTo).
  const int64_t held = 2 * guaranteed + 4;
  int64_t b_requests = 0;
  while (UsageOf(*engine, "b").device_cached_pages < held) {
    ASSERT_TRUE(CacheAs(*engine, kHolderB, "b",
                        Seq(1'000'000 + 100 * b_requests++, 2 * kP))
                    .ok());
  }
  // "a" floods: five pool's worth of distinct sequences.
  for (int i = 0; i < 5 * capacity / 4; ++i) {
    const absl::Status s = CacheAs(*engine, kHolderA, "a", Seq(100 * i, 4 * kP));
    ASSERT_TRUE(s.ok()) << "flood request " << i << ": " << s;
    const NamespaceQuotaUsage b = UsageOf(*engine, "b");
    ASSERT_GE(b.device_cached_pages, guaranteed) << "flood request " << i;
    ASSERT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
  }
  // The flood did take what "b" held above that.
  EXPECT_LT(UsageOf(*engine, "b").device_cached_pages, held);
  EXPECT_TRUE(engine->CheckInvariants().ok()) << engine->CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(
    DefaultsAndEveryWritePolicy, FloodTest,
    ::testing::Combine(::testing::Values(EngineOptions{}.write_policy,
                                         WritePolicy::kWriteBack,
                                         WritePolicy::kWriteThrough,
                                         WritePolicy::kWriteThroughSelective),
                       ::testing::Values(1u, 2u, 4u)),
    [](const auto& info) {
      return absl::StrCat(PolicyName(std::get<0>(info.param)) == "write_ahead"
                              ? "default_write_ahead"
                              : std::string(PolicyName(std::get<0>(info.param))),
                          "_c", std::get<1>(info.param));
    });

}  // namespace
}  // namespace hicache
