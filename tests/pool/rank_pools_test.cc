#include "daemon/pool/rank_pools.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "daemon/pool/shm_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

// Unit-test double: counts pools and fails the N-th creation.
class FailingBackend final : public PoolBackend {
 public:
  explicit FailingBackend(int fail_at) : fail_at_(fail_at) {}
  absl::StatusOr<std::unique_ptr<KvPool>> CreateDevicePool(
      Rank rank, uint64_t size) override {
    return Next(absl::StrCat("-device-r", rank), size);
  }
  absl::StatusOr<std::unique_ptr<KvPool>> CreateHostPool(Rank rank,
                                                         uint64_t size,
                                                         bool) override {
    return Next(absl::StrCat("-host-r", rank), size);
  }
  std::vector<std::string> names;

 private:
  absl::StatusOr<std::unique_ptr<KvPool>> Next(const std::string& suffix,
                                               uint64_t size) {
    if (++calls_ == fail_at_) return absl::ResourceExhaustedError("no memory");
    names.push_back(absl::StrCat("/hicache-rp-", getpid(), suffix));
    auto pool = ShmPool::Create(names.back(), size, false);
    if (!pool.ok()) return pool.status();
    return std::unique_ptr<KvPool>(*std::move(pool));
  }
  int fail_at_;
  int calls_ = 0;
};

bool SegmentExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(RankPoolsTest, OnePoolPairPerServedRank) {
  const CpLayout layout = *CpLayout::Create(4, 4, {1, 3});
  const KvGeometry geometry = *KvGeometry::Preset("tiny-draft", 4);
  ShmPoolBackend backend(absl::StrCat("/hicache-rp1-", getpid()));
  RankPoolsOptions options{.device_pages_per_rank = 8,
                           .host_pages_per_rank = 32};
  auto pools = RankPools::Create(layout, geometry, options, backend);
  ASSERT_TRUE(pools.ok()) << pools.status();
  for (Rank r = 0; r < 4; ++r) {
    const bool served = r == 1 || r == 3;
    EXPECT_EQ((*pools)->device(r) != nullptr, served) << r;
    EXPECT_EQ((*pools)->host(r) != nullptr, served) << r;
  }
  EXPECT_EQ((*pools)->device(1)->size_bytes(), geometry.PoolBytes(8));
  EXPECT_EQ((*pools)->host(3)->size_bytes(), geometry.PoolBytes(32));
  EXPECT_EQ((*pools)->device(7), nullptr);
}

TEST(RankPoolsTest, AllOrNothing) {
  const CpLayout layout = *CpLayout::Create(4, 2);
  const KvGeometry geometry = *KvGeometry::Preset("tiny", 4);
  FailingBackend backend(/*fail_at=*/4);  // Rank 1's host pool.
  auto pools = RankPools::Create(
      layout, geometry, {.device_pages_per_rank = 4, .host_pages_per_rank = 4},
      backend);
  EXPECT_EQ(pools.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_EQ(backend.names.size(), 3u);
  for (const std::string& name : backend.names) {
    EXPECT_FALSE(SegmentExists(name)) << name << " leaked";
  }
}

TEST(RankPoolsTest, RejectsMismatchedGeometry) {
  const CpLayout layout = *CpLayout::Create(64, 1);
  ShmPoolBackend backend(absl::StrCat("/hicache-rp2-", getpid()));
  EXPECT_THAT(RankPools::Create(layout, *KvGeometry::Preset("tiny", 16),
                                {.device_pages_per_rank = 4}, backend)
                  .status()
                  .message(),
              HasSubstr("page size 16"));
  EXPECT_FALSE(RankPools::Create(layout, *KvGeometry::Preset("tiny", 64),
                                 {.device_pages_per_rank = 1}, backend)
                   .ok());
}

}  // namespace
}  // namespace hicache
