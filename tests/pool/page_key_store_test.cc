// PageKeyStore: slots round-trip and are bounds-checked; Open creates kept
// /dev/shm segments that the next Open of the same fingerprint attaches with
// their tokens, another fingerprint removes; RemovePersistentHostSegments
// removes them with the host segments. The record checksum mixes a page's
// KV checksum with its tokens, and KvChecksumFor undoes it for the same
// tokens only.
#include "daemon/pool/page_key_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/pool/persistent_host_segment.h"
#include "daemon/pool/shm_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

bool Exists(const std::string& shm_name) {
  return access(absl::StrCat("/dev/shm", shm_name).c_str(), F_OK) == 0;
}

std::vector<int32_t> Read(const PageKeyStore& store, Rank rank, int64_t page,
                          size_t count) {
  auto tokens = store.Read(rank, page, count);
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (!tokens.ok()) return {};
  return std::vector<int32_t>(tokens->begin(), tokens->end());
}

TEST(PageKeyStoreTest, SlotsRoundTripAndAreIndependent) {
  auto store = PageKeyStore::InMemory(2, 8, 4);
  ASSERT_TRUE(store.ok()) << store.status();
  PageKeyStore& s = **store;
  EXPECT_FALSE(s.attached());
  EXPECT_EQ(s.num_ranks(), 2u);
  EXPECT_EQ(s.pages_per_rank(), 8);
  EXPECT_EQ(s.page_size(), 4u);
  ASSERT_TRUE(s.Write(0, 7, std::vector<int32_t>{1, 2, 3, 4}).ok());
  ASSERT_TRUE(s.Write(1, 7, std::vector<int32_t>{-5, 6}).ok());  // Partial.
  ASSERT_TRUE(s.Write(0, 6, std::vector<int32_t>{9, 9, 9, 9}).ok());
  EXPECT_THAT(Read(s, 0, 7, 4), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(Read(s, 1, 7, 2), ElementsAre(-5, 6));
  EXPECT_THAT(Read(s, 0, 6, 3), ElementsAre(9, 9, 9));
  EXPECT_THAT(Read(s, 1, 0, 4), ElementsAre(0, 0, 0, 0));  // Zeroed.
  EXPECT_TRUE(Read(s, 1, 0, 0).empty());
  // A shorter write leaves the rest of the slot as it was.
  ASSERT_TRUE(s.Write(0, 7, std::vector<int32_t>{8}).ok());
  EXPECT_THAT(Read(s, 0, 7, 4), ElementsAre(8, 2, 3, 4));
}

TEST(PageKeyStoreTest, OutOfRangeIsRefusedAndWritesNothing) {
  auto store = PageKeyStore::InMemory(2, 8, 4);
  ASSERT_TRUE(store.ok());
  PageKeyStore& s = **store;
  const std::vector<int32_t> four = {1, 2, 3, 4};
  const std::vector<int32_t> five = {1, 2, 3, 4, 5};
  for (const absl::Status& status :
       {s.Write(2, 0, four), s.Write(0, 8, four), s.Write(0, -1, four),
        s.Write(0, 0, five)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  EXPECT_THAT(Read(s, 0, 0, 4), ElementsAre(0, 0, 0, 0));
  EXPECT_EQ(s.Read(2, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Read(0, 8, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Read(0, -1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Read(0, 0, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// WriteNode puts key page i in the slot of its owner's next page, in
// position order per rank, like CpHostMeta lists them.
TEST(PageKeyStoreTest, WriteNodeWritesEachKeyPageToItsOwnersNextPage) {
  auto store = PageKeyStore::InMemory(2, 8, 4);
  ASSERT_TRUE(store.ok());
  PageKeyStore& s = **store;
  const std::vector<int32_t> k0 = {1, 2, 3, 4}, k1 = {5, 6, 7, 8},
                             k2 = {9, 10, 11, 12}, k3 = {13};
  const std::vector<absl::Span<const int32_t>> key = {k0, k1, k2, k3};
  const std::vector<uint32_t> owners = {1, 0, 1, 1};
  const std::vector<std::vector<int64_t>> pages = {{3}, {7, 0, 5}};
  ASSERT_TRUE(s.WriteNode(owners, pages, key).ok());
  EXPECT_THAT(Read(s, 1, 7, 4), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(Read(s, 0, 3, 4), ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(Read(s, 1, 0, 4), ElementsAre(9, 10, 11, 12));
  // The last page is short: the rest of its slot is left as it was.
  EXPECT_THAT(Read(s, 1, 5, 4), ElementsAre(13, 0, 0, 0));
  EXPECT_TRUE(s.WriteNode({}, {}, {}).ok());  // An empty node: nothing.
}

// Every check comes before the first byte: a bad page anywhere in the node
// leaves every slot as it was.
TEST(PageKeyStoreTest, WriteNodeRefusesABadNodeAndWritesNothing) {
  auto store = PageKeyStore::InMemory(2, 8, 4);
  ASSERT_TRUE(store.ok());
  PageKeyStore& s = **store;
  const std::vector<int32_t> four = {1, 2, 3, 4}, five = {1, 2, 3, 4, 5};
  const std::vector<absl::Span<const int32_t>> two = {four, four};
  using Pages = std::vector<std::vector<int64_t>>;
  struct Case {
    std::vector<uint32_t> owners;
    Pages pages;
    std::vector<absl::Span<const int32_t>> key;
  };
  const Case cases[] = {
      {{0}, Pages{{1}}, two},                       // 2 key pages, 1 owner.
      {{0, 0}, Pages{{1}}, two},                    // Rank 0 has 1 page.
      {{0, 2}, Pages{{1}, {2}, {3}}, two},          // Rank 2 of 2.
      {{0, 1}, Pages{{1}}, two},                    // No list for rank 1.
      {{0, 0}, Pages{{1, 8}}, two},                 // Page 8 of 8.
      {{0, 0}, Pages{{1, -1}}, two},                // Negative page.
      {{0, 0}, Pages{{1, 2}}, {four, five}},        // 5 tokens, page of 4.
  };
  for (const Case& c : cases) {
    EXPECT_EQ(s.WriteNode(c.owners, c.pages, c.key).code(),
              absl::StatusCode::kInvalidArgument);
  }
  for (int64_t page = 0; page < 8; ++page) {
    EXPECT_THAT(Read(s, 0, page, 4), ElementsAre(0, 0, 0, 0)) << page;
    EXPECT_THAT(Read(s, 1, page, 4), ElementsAre(0, 0, 0, 0)) << page;
  }
}

TEST(PageKeyStoreTest, BadShapesAreRefused) {
  EXPECT_EQ(PageKeyStore::InMemory(0, 8, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageKeyStore::InMemory(1, 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageKeyStore::InMemory(1, 8, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageKeyStore::InMemory(1, int64_t{1} << 40, 64).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PageKeyStore::Open({.prefix = "/hicache-pkstest-never",
                                .num_ranks = 1,
                                .pages_per_rank = int64_t{1} << 40,
                                .page_size = 64})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists("/hicache-pkstest-never-keys-r0-g0000000000000000"));
}

class PageKeyStoreShmTest : public ::testing::Test {
 protected:
  void TearDown() override { (void)RemovePersistentHostSegments(prefix_); }
  PageKeyStore::Options Options(uint64_t fingerprint) const {
    return {.prefix = prefix_,
            .num_ranks = 2,
            .pages_per_rank = 16,
            .page_size = 8,
            .fingerprint = fingerprint};
  }
  const std::string prefix_ = absl::StrCat("/hicache-pkstest", getpid());
};

TEST_F(PageKeyStoreShmTest, TheNextOpenOfTheSameGeometryAttachesTheKeys) {
  {
    auto store = PageKeyStore::Open(Options(0x77));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_FALSE((*store)->attached());
    ASSERT_TRUE((*store)->Write(1, 15, std::vector<int32_t>{4, 5, 6}).ok());
  }  // The daemon stops: the segments are kept.
  EXPECT_TRUE(Exists(ShmPool::PersistentName(prefix_, "keys", 0, 0x77)));
  EXPECT_TRUE(Exists(ShmPool::PersistentName(prefix_, "keys", 1, 0x77)));
  auto again = PageKeyStore::Open(Options(0x77));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->attached());
  EXPECT_TRUE((*again)->removed().empty());
  EXPECT_THAT(Read(**again, 1, 15, 3), ElementsAre(4, 5, 6));
}

TEST_F(PageKeyStoreShmTest, AnotherGeometryRemovesTheOldKeysAndStartsEmpty) {
  {
    auto store = PageKeyStore::Open(Options(0x1));
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Write(0, 0, std::vector<int32_t>{7}).ok());
  }
  auto other = PageKeyStore::Open(Options(0x2));
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE((*other)->attached());
  EXPECT_THAT((*other)->removed(),
              UnorderedElementsAre(
                  ShmPool::PersistentName(prefix_, "keys", 0, 0x1),
                  ShmPool::PersistentName(prefix_, "keys", 1, 0x1)));
  EXPECT_THAT(Read(**other, 0, 0, 1), ElementsAre(0));
}

TEST_F(PageKeyStoreShmTest, OneRankMissingMeansNotAttached) {
  { ASSERT_TRUE(PageKeyStore::Open(Options(0x5)).ok()); }
  ASSERT_EQ(
      shm_unlink(ShmPool::PersistentName(prefix_, "keys", 1, 0x5).c_str()), 0);
  auto store = PageKeyStore::Open(Options(0x5));
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE((*store)->attached());
}

TEST_F(PageKeyStoreShmTest, RemovedWithTheHostSegmentsOfTheirPrefix) {
  { ASSERT_TRUE(PageKeyStore::Open(Options(0x9)).ok()); }
  {
    ASSERT_TRUE(OpenPersistentHostSegment(prefix_, 0, 4096, false, 0x9).ok());
  }
  EXPECT_THAT(RemovePersistentHostSegments(prefix_),
              UnorderedElementsAre(
                  ShmPool::PersistentHostName(prefix_, 0, 0x9),
                  ShmPool::PersistentName(prefix_, "keys", 0, 0x9),
                  ShmPool::PersistentName(prefix_, "keys", 1, 0x9)));
  EXPECT_FALSE(Exists(ShmPool::PersistentName(prefix_, "keys", 0, 0x9)));
}

TEST(PageRecordChecksumTest, MixesTheTokensInAndOnlyTheSameTokensUndoIt) {
  const std::vector<int32_t> a = {1, 2, 3};
  const std::vector<int32_t> b = {1, 2, 4};
  const std::vector<int32_t> shorter = {1, 2};
  const uint64_t kv = 0x0123456789abcdefull;
  const uint64_t recorded = PageRecordChecksum(kv, a);
  EXPECT_NE(recorded, kv);
  EXPECT_EQ(KvChecksumFor(recorded, a), kv);
  EXPECT_NE(KvChecksumFor(recorded, b), kv);
  EXPECT_NE(KvChecksumFor(recorded, shorter), kv);
  EXPECT_NE(PageTokensChecksum(a), PageTokensChecksum(b));
  EXPECT_EQ(PageTokensChecksum(a), PageTokensChecksum(std::vector<int32_t>(a)));
}

}  // namespace
}  // namespace hicache
