#include "daemon/pool/page_checksum.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/pool/shm_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr HostLayout kLayouts[] = {HostLayout::kLayerFirst,
                                   HostLayout::kPageFirst};

std::string LayoutName(HostLayout layout) {
  return std::string(HostLayoutName(layout));
}

std::vector<uint8_t> RandomBytes(uint64_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// The model: the page's bytes, gathered block by block (family, then layer)
// with the geometry's addressing, hashed in one call.
std::vector<uint8_t> GatherPage(const KvGeometry& g, HostLayout layout,
                                int64_t num_pages,
                                const std::vector<uint8_t>& pool,
                                int64_t page) {
  std::vector<uint8_t> bytes;
  for (int f = 0; f < static_cast<int>(g.families().size()); ++f) {
    for (uint32_t l = 0; l < g.families()[f].num_layers; ++l) {
      const uint64_t at = g.HostOffset(layout, num_pages, page, f, l);
      bytes.insert(bytes.end(), pool.begin() + at,
                   pool.begin() + at + g.BlockBytes(f));
    }
  }
  return bytes;
}

uint64_t ModelChecksum(const KvGeometry& g, HostLayout layout,
                       int64_t num_pages, const std::vector<uint8_t>& pool,
                       int64_t page) {
  const std::vector<uint8_t> bytes =
      GatherPage(g, layout, num_pages, pool, page);
  return XXH3_64bits(bytes.data(), bytes.size());
}

// Owner page of every pool byte, from the geometry's addressing.
std::vector<int64_t> ByteOwners(const KvGeometry& g, HostLayout layout,
                                int64_t num_pages) {
  std::vector<int64_t> owner(g.PoolBytes(num_pages), -1);
  for (int64_t p = 0; p < num_pages; ++p) {
    for (int f = 0; f < static_cast<int>(g.families().size()); ++f) {
      for (uint32_t l = 0; l < g.families()[f].num_layers; ++l) {
        const uint64_t at = g.HostOffset(layout, num_pages, p, f, l);
        for (uint64_t i = 0; i < g.BlockBytes(f); ++i) owner[at + i] = p;
      }
    }
  }
  return owner;
}

std::vector<int64_t> AllPages(int64_t num_pages) {
  std::vector<int64_t> pages(num_pages);
  for (int64_t p = 0; p < num_pages; ++p) pages[p] = p;
  return pages;
}

struct Case {
  const char* preset;
  uint32_t page_size;
};

constexpr Case kCases[] = {
    {"tiny", 64},       {"tiny", 1},  {"tiny-draft", 64},
    {"tiny-draft", 4},  {"micro", 64}, {"micro", 16},
    {"deepseek-v3.2-fp8", 1},
};

TEST(PageChecksumTest, AgreesWithTheGatheringModel) {
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const KvGeometry g = *KvGeometry::Preset(c.preset, c.page_size);
    for (const int64_t num_pages : {1, 3, 17}) {
      for (const HostLayout layout : kLayouts) {
        SCOPED_TRACE(absl::StrCat(c.preset, " P=", c.page_size, " pages=",
                                  num_pages, " ", LayoutName(layout)));
        const std::vector<uint8_t> pool =
            RandomBytes(g.PoolBytes(num_pages), seed++);
        std::vector<uint64_t> model;
        for (int64_t p = 0; p < num_pages; ++p) {
          model.push_back(ModelChecksum(g, layout, num_pages, pool, p));
          auto one = HostPageChecksum(g, layout, num_pages, pool, p);
          ASSERT_TRUE(one.ok()) << one.status();
          EXPECT_EQ(*one, model.back()) << "page " << p;
        }
        auto batch =
            HostPageChecksums(g, layout, num_pages, pool, AllPages(num_pages));
        ASSERT_TRUE(batch.ok()) << batch.status();
        EXPECT_THAT(*batch, ElementsAreArray(model));
        // Distinct random pages, distinct checksums.
        for (int64_t p = 1; p < num_pages; ++p) {
          EXPECT_NE(model[p], model[p - 1]);
        }
      }
    }
  }
}

// ReadHostPage gives the model's gathered bytes; WriteHostPage puts them
// back touching only that page's bytes; a page moved between layouts keeps
// its checksum.
TEST(PageChecksumTest, ReadAndWriteAPageInTheChecksumsOrder) {
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    const KvGeometry g = *KvGeometry::Preset(c.preset, c.page_size);
    const int64_t num_pages = 4;
    const std::vector<uint8_t> src =
        RandomBytes(g.PoolBytes(num_pages), seed++);
    std::vector<uint8_t> dst(g.PoolBytes(num_pages), 0);
    SCOPED_TRACE(absl::StrCat(c.preset, " P=", c.page_size));
    std::vector<uint8_t> page(g.BytesPerPage());
    ASSERT_TRUE(ReadHostPage(g, HostLayout::kLayerFirst, num_pages, src, 2,
                             absl::MakeSpan(page))
                    .ok());
    EXPECT_EQ(page, GatherPage(g, HostLayout::kLayerFirst, num_pages, src, 2));
    ASSERT_TRUE(
        WriteHostPage(g, HostLayout::kPageFirst, num_pages,
                      absl::MakeSpan(dst), 1, page)
            .ok());
    EXPECT_EQ(*HostPageChecksum(g, HostLayout::kPageFirst, num_pages, dst, 1),
              ModelChecksum(g, HostLayout::kLayerFirst, num_pages, src, 2));
    const std::vector<int64_t> owner =
        ByteOwners(g, HostLayout::kPageFirst, num_pages);
    for (size_t i = 0; i < dst.size(); ++i) {
      if (owner[i] != 1) ASSERT_EQ(dst[i], 0) << "byte " << i;
    }
    // Wrong sizes and pages are refused before a byte moves.
    std::vector<uint8_t> small(g.BytesPerPage() - 1);
    EXPECT_EQ(ReadHostPage(g, HostLayout::kPageFirst, num_pages, src, 0,
                           absl::MakeSpan(small))
                  .code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(WriteHostPage(g, HostLayout::kPageFirst, num_pages,
                            absl::MakeSpan(dst), num_pages, page)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// The same logical page bytes give the same checksum under both layouts.
TEST(PageChecksumTest, IndependentOfTheLayout) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(absl::StrCat(c.preset, " P=", c.page_size));
    const KvGeometry g = *KvGeometry::Preset(c.preset, c.page_size);
    const int64_t num_pages = 5;
    // The page-first pool's bytes are the logical pages in order; lay the
    // same pages out layer-first.
    const std::vector<uint8_t> page_first =
        RandomBytes(g.PoolBytes(num_pages), 99);
    std::vector<uint8_t> layer_first(page_first.size());
    for (int64_t p = 0; p < num_pages; ++p) {
      for (int f = 0; f < static_cast<int>(g.families().size()); ++f) {
        for (uint32_t l = 0; l < g.families()[f].num_layers; ++l) {
          std::copy_n(
              page_first.begin() +
                  g.HostOffset(HostLayout::kPageFirst, num_pages, p, f, l),
              g.BlockBytes(f),
              layer_first.begin() +
                  g.HostOffset(HostLayout::kLayerFirst, num_pages, p, f, l));
        }
      }
    }
    uint32_t blocks = 0;
    for (const KvFamily& f : g.families()) blocks += f.num_layers;
    // With one block per page ("micro") the two layouts coincide.
    if (blocks > 1) ASSERT_NE(page_first, layer_first);
    auto a = HostPageChecksums(g, HostLayout::kPageFirst, num_pages,
                               page_first, AllPages(num_pages));
    auto b = HostPageChecksums(g, HostLayout::kLayerFirst, num_pages,
                               layer_first, AllPages(num_pages));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    // And a page-first page is just XXH3-64 of its contiguous bytes.
    EXPECT_EQ((*a)[2], XXH3_64bits(page_first.data() + 2 * g.BytesPerPage(),
                                   g.BytesPerPage()));
  }
}

// Flipping any one byte of the pool changes the checksum of the page that
// owns it and of no other page.
TEST(PageChecksumTest, EveryByteCountsForItsPageOnly) {
  for (const char* preset : {"tiny-draft", "micro"}) {
    const KvGeometry g = *KvGeometry::Preset(preset, 4);
    const int64_t num_pages = 5;
    for (const HostLayout layout : kLayouts) {
      SCOPED_TRACE(absl::StrCat(preset, " ", LayoutName(layout)));
      std::vector<uint8_t> pool = RandomBytes(g.PoolBytes(num_pages), 7);
      const std::vector<int64_t> owner = ByteOwners(g, layout, num_pages);
      const std::vector<int64_t> pages = AllPages(num_pages);
      const std::vector<uint64_t> clean =
          *HostPageChecksums(g, layout, num_pages, pool, pages);
      for (uint64_t at = 0; at < pool.size(); ++at) {
        ASSERT_GE(owner[at], 0) << "byte " << at << " belongs to no page";
        for (const uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
          pool[at] ^= mask;
          const std::vector<uint64_t> dirty =
              *HostPageChecksums(g, layout, num_pages, pool, pages);
          pool[at] ^= mask;
          for (int64_t p = 0; p < num_pages; ++p) {
            if (p == owner[at]) {
              EXPECT_NE(dirty[p], clean[p]) << "byte " << at;
            } else {
              EXPECT_EQ(dirty[p], clean[p]) << "byte " << at << " page " << p;
            }
          }
        }
      }
    }
  }
}

TEST(PageChecksumTest, RefusesPagesOutsideThePool) {
  const KvGeometry g = *KvGeometry::Preset("tiny-draft", 4);
  const int64_t n = 8;
  const std::vector<uint8_t> pool = RandomBytes(g.PoolBytes(n), 3);
  for (const HostLayout layout : kLayouts) {
    for (const int64_t bad : {int64_t{-1}, n, n + 1, INT64_MAX, INT64_MIN}) {
      auto one = HostPageChecksum(g, layout, n, pool, bad);
      EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(one.status().message(), HasSubstr("outside the pool"));
      auto batch = HostPageChecksums(g, layout, n, pool, {0, 1, bad});
      EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(batch.status().message(), HasSubstr("entry 2"));
      auto verify =
          VerifyHostPages(g, layout, n, pool, {bad, 0}, {0, 0}, /*threads=*/2);
      EXPECT_EQ(verify.status().code(), absl::StatusCode::kInvalidArgument);
    }
    // A view too short for its page count (the last page would overrun).
    absl::Span<const uint8_t> short_view(pool.data(), pool.size() - 1);
    auto overrun = HostPageChecksum(g, layout, n, short_view, 0);
    EXPECT_EQ(overrun.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(overrun.status().message(), HasSubstr("bytes"));
    // A page count whose byte size would overflow 64 bits.
    EXPECT_EQ(HostPageChecksum(g, layout, INT64_MAX, pool, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(HostPageChecksum(g, layout, -1, pool, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(HostPageChecksum(g, layout, 1, {}, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
    // An empty pool with nothing to hash is fine.
    auto none = HostPageChecksums(g, layout, 0, {}, {});
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_THAT(*none, IsEmpty());
    // A larger buffer than needed is fine: only the first PoolBytes count.
    std::vector<uint8_t> bigger = pool;
    bigger.push_back(0xff);
    EXPECT_EQ(*HostPageChecksum(g, layout, n, bigger, n - 1),
              *HostPageChecksum(g, layout, n, pool, n - 1));
  }
}

TEST(PageChecksumTest, VerifyRefusesMalformedRequests) {
  const KvGeometry g = *KvGeometry::Preset("tiny", 4);
  const std::vector<uint8_t> pool = RandomBytes(g.PoolBytes(4), 5);
  const HostLayout layout = HostLayout::kLayerFirst;
  auto mismatch = VerifyHostPages(g, layout, 4, pool, {0, 1}, {0}, 1);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("expected checksums"));
  for (const int threads : {0, -3}) {
    auto none = VerifyHostPages(g, layout, 4, pool, {0}, {0}, threads);
    EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  }
  auto empty = VerifyHostPages(g, layout, 4, pool, {}, {}, 4);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_THAT(*empty, IsEmpty());
}

// VerifyHostPages reports exactly the positions of the corrupted pages,
// whatever the thread count (more threads than pages included).
TEST(PageChecksumTest, VerifyFindsExactlyTheCorruptedPages) {
  for (const char* preset : {"tiny", "tiny-draft"}) {
    const KvGeometry g = *KvGeometry::Preset(preset, 16);
    const int64_t n = 64;
    for (const HostLayout layout : kLayouts) {
      std::vector<uint8_t> pool = RandomBytes(g.PoolBytes(n), 11);
      // Out of order, with a repeat: positions, not pages, are reported.
      std::vector<int64_t> pages = AllPages(n);
      std::reverse(pages.begin(), pages.end());
      pages.push_back(17);
      const std::vector<uint64_t> expected =
          *HostPageChecksums(g, layout, n, pool, pages);
      for (const int threads : {1, 2, 4, 100}) {
        SCOPED_TRACE(absl::StrCat(preset, " ", LayoutName(layout), " ",
                                  threads, " threads"));
        auto clean = VerifyHostPages(g, layout, n, pool, pages, expected,
                                     threads);
        ASSERT_TRUE(clean.ok()) << clean.status();
        EXPECT_THAT(*clean, IsEmpty());
      }
      // Corrupt pages 0, 17 and 63: one byte each, in the last layer's block
      // of the last family (scattered under layer_first).
      const int last = static_cast<int>(g.families().size()) - 1;
      const uint32_t layer = g.families()[last].num_layers - 1;
      for (const int64_t p : {int64_t{0}, int64_t{17}, int64_t{63}}) {
        pool[g.HostOffset(layout, n, p, last, layer) + 3] ^= 0x10;
      }
      // Positions of pages 63, 17 and 0 in `pages`, plus the repeat of 17.
      for (const int threads : {1, 2, 4, 100}) {
        SCOPED_TRACE(absl::StrCat(preset, " ", LayoutName(layout), " ",
                                  threads, " threads"));
        auto bad = VerifyHostPages(g, layout, n, pool, pages, expected,
                                   threads);
        ASSERT_TRUE(bad.ok()) << bad.status();
        EXPECT_THAT(*bad, ElementsAre(0, 46, 63, 64));
      }
      // Two pages on four threads: each corrupt one found once.
      auto two = VerifyHostPages(g, layout, n, pool, {17, 18},
                                 {expected[46], expected[45]}, 4);
      ASSERT_TRUE(two.ok());
      EXPECT_THAT(*two, ElementsAre(0));
    }
  }
}

// The hot-restart mechanism end to end: a process writes pages into a
// geometry-tagged host segment, records their checksums and is SIGKILLed;
// the next owner attaches the segment, finds every page intact, and after a
// byte is flipped "while the daemon is down" finds exactly that page.
TEST(PageChecksumTest, VerifiesASegmentAKilledOwnerLeft) {
  const KvGeometry g = *KvGeometry::Preset("tiny-draft", 16);
  const int64_t n = 32;
  for (const HostLayout layout : kLayouts) {
    const uint64_t fingerprint = g.HostFingerprint(layout, n, 1);
    const std::string name = ShmPool::PersistentHostName(
        absl::StrCat("/hicache-test-", getpid(), "-", LayoutName(layout)), 0,
        fingerprint);
    int pipe_fds[2];
    ASSERT_EQ(pipe(pipe_fds), 0);
    const pid_t child = fork();
    if (child == 0) {
      close(pipe_fds[0]);
      auto pool = ShmPool::Create(name, g.PoolBytes(n), false);
      if (!pool.ok()) _exit(1);
      const std::vector<uint8_t> bytes = RandomBytes(g.PoolBytes(n), 21);
      std::memcpy((*pool)->host_data(), bytes.data(), bytes.size());
      auto sums = HostPageChecksums(
          g, layout, n,
          {static_cast<const uint8_t*>((*pool)->host_data()), bytes.size()},
          AllPages(n));
      if (!sums.ok()) _exit(2);
      const size_t len = sums->size() * sizeof(uint64_t);
      if (write(pipe_fds[1], sums->data(), len) != static_cast<ssize_t>(len)) {
        _exit(3);
      }
      raise(SIGKILL);
      _exit(4);
    }
    close(pipe_fds[1]);
    std::vector<uint64_t> recorded(n);
    const size_t len = recorded.size() * sizeof(uint64_t);
    ASSERT_EQ(read(pipe_fds[0], recorded.data(), len),
              static_cast<ssize_t>(len));
    close(pipe_fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));

    auto pool = ShmPool::Attach(name, g.PoolBytes(n), false);
    ASSERT_TRUE(pool.ok()) << pool.status();  // Unlinked when it goes.
    auto* base = static_cast<uint8_t*>((*pool)->host_data());
    const absl::Span<const uint8_t> view(base, (*pool)->size_bytes());
    auto intact = VerifyHostPages(g, layout, n, view, AllPages(n), recorded, 2);
    ASSERT_TRUE(intact.ok()) << intact.status();
    EXPECT_THAT(*intact, IsEmpty());
    base[g.HostOffset(layout, n, 20, 1, 0) + 5] ^= 0x01;  // Draft block.
    auto corrupt = VerifyHostPages(g, layout, n, view, AllPages(n), recorded, 2);
    ASSERT_TRUE(corrupt.ok());
    EXPECT_THAT(*corrupt, ElementsAre(20));
  }
}

}  // namespace
}  // namespace hicache
