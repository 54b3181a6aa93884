// JournalWriter::Split and Reparent: written as Drop + Put records that a
// fresh load replays into exactly the records the tree now has.
#include <random>
#include <string>
#include <vector>

#include "daemon/persist/journal_reader.h"
#include "daemon/persist/journal_writer.h"
#include "daemon/persist/state_dir.h"
#include "gtest/gtest.h"
#include "tests/persist/journal_test_util.h"
#include "tests/testing/temp_dir.h"

namespace hicache::persist {
namespace {

using testing::MakePut;
using testing::TestGeometry;

class ReshapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(PrepareStateDir(dir_.path()).ok());
    auto writer = JournalWriter::Open(dir_.path(), geometry_, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    writer_ = *std::move(writer);
  }
  std::vector<PutRecord> Reload() {
    EXPECT_TRUE(writer_->Flush().ok());
    auto loaded = LoadJournal(dir_.path(), &geometry_);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return loaded.ok() ? loaded->puts : std::vector<PutRecord>{};
  }
  const PutRecord* Find(const std::vector<PutRecord>& puts, uint64_t id) {
    for (const PutRecord& put : puts) {
      if (put.persist_id == id) return &put;
    }
    return nullptr;
  }

  ::hicache::testing::TempDir dir_;
  JournalGeometry geometry_ = TestGeometry(/*cp_size=*/2);
  std::unique_ptr<JournalWriter> writer_;
  std::mt19937_64 rng_{3};
};

TEST_F(ReshapeTest, SplitGivesTheHeadTheFirstPagesAndKeepsChildren) {
  const PutRecord a = MakePut(1, 0, "ns", 5, geometry_, rng_);
  const PutRecord child = MakePut(2, 1, "ns", 2, geometry_, rng_);
  ASSERT_TRUE(writer_->Put(a).ok());
  ASSERT_TRUE(writer_->Put(child).ok());
  const int64_t at = 2 * geometry_.page_size;
  ASSERT_TRUE(writer_->Split(1, at, 7).ok());
  const std::vector<PutRecord> puts = Reload();
  ASSERT_EQ(puts.size(), 3u);
  const PutRecord* head = Find(puts, 7);
  const PutRecord* tail = Find(puts, 1);
  ASSERT_NE(head, nullptr);
  ASSERT_NE(tail, nullptr);
  EXPECT_EQ(head->parent_persist_id, 0u);
  EXPECT_EQ(tail->parent_persist_id, 7u);
  EXPECT_EQ(head->logical_len, at);
  EXPECT_EQ(tail->logical_len, a.logical_len - at);
  EXPECT_EQ(head->name_space, a.name_space);
  EXPECT_EQ(tail->name_space, a.name_space);
  std::vector<uint32_t> owners = head->page_owners;
  owners.insert(owners.end(), tail->page_owners.begin(),
                tail->page_owners.end());
  EXPECT_EQ(owners, a.page_owners);
  for (size_t r = 0; r < 2; ++r) {
    std::vector<int64_t> pages = head->host_pages[r];
    pages.insert(pages.end(), tail->host_pages[r].begin(),
                 tail->host_pages[r].end());
    EXPECT_EQ(pages, a.host_pages[r]) << "rank " << r;
    std::vector<uint64_t> sums = head->checksums[r];
    sums.insert(sums.end(), tail->checksums[r].begin(),
                tail->checksums[r].end());
    EXPECT_EQ(sums, a.checksums[r]) << "rank " << r;
  }
  ASSERT_NE(Find(puts, 2), nullptr);
  EXPECT_EQ(Find(puts, 2)->parent_persist_id, 1u);  // Still the tail's.
}

TEST_F(ReshapeTest, ReparentMovesADetachedRecordUnderItsNewParent) {
  const PutRecord detached = MakePut(3, ~uint64_t{0}, "ns", 2, geometry_, rng_);
  ASSERT_TRUE(writer_->Put(detached).ok());
  // Detached: the loader drops it as an orphan.
  EXPECT_EQ(Reload().size(), 0u);
  ASSERT_TRUE(writer_->Put(MakePut(4, 0, "ns", 2, geometry_, rng_)).ok());
  ASSERT_TRUE(writer_->Reparent(3, 4).ok());
  const std::vector<PutRecord> puts = Reload();
  ASSERT_EQ(puts.size(), 2u);
  ASSERT_NE(Find(puts, 3), nullptr);
  EXPECT_EQ(Find(puts, 3)->parent_persist_id, 4u);
  PutRecord moved = detached;
  moved.parent_persist_id = 4;
  EXPECT_EQ(*Find(puts, 3), moved);
}

TEST_F(ReshapeTest, UnknownIdsChangeNothingAndBadSplitsAreRefused) {
  ASSERT_TRUE(writer_->Put(MakePut(1, 0, "ns", 3, geometry_, rng_)).ok());
  ASSERT_TRUE(writer_->Put(MakePut(2, 0, "ns", 3, geometry_, rng_)).ok());
  EXPECT_TRUE(writer_->Split(99, geometry_.page_size, 100).ok());
  EXPECT_TRUE(writer_->Reparent(99, 1).ok());
  const int64_t page = geometry_.page_size;
  EXPECT_TRUE(absl::IsInvalidArgument(writer_->Split(1, 0, 5)));
  EXPECT_TRUE(absl::IsInvalidArgument(writer_->Split(1, page + 1, 5)));
  EXPECT_TRUE(absl::IsInvalidArgument(writer_->Split(1, 3 * page, 5)));
  EXPECT_TRUE(absl::IsInvalidArgument(writer_->Split(1, page, 2)));  // Live.
  EXPECT_TRUE(absl::IsInvalidArgument(writer_->Split(1, page, 1)));  // Self.
  EXPECT_TRUE(absl::IsInvalidArgument(writer_->Split(1, page, 0)));
  EXPECT_EQ(Reload().size(), 2u);
}

// Many splits and reparents, then a compaction and a reopen: the load equals
// the writer's view each time.
TEST_F(ReshapeTest, SurvivesCompactionAndReopen) {
  std::vector<PutRecord> expected;
  uint64_t next = 1;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(writer_->Put(MakePut(next++, 0, "ns", 4, geometry_, rng_)).ok());
  }
  for (uint64_t id = 1; id <= 50; ++id) {
    ASSERT_TRUE(writer_->Split(id, geometry_.page_size, next++).ok());
  }
  const std::vector<PutRecord> before = Reload();
  EXPECT_EQ(before.size(), 100u);
  writer_.reset();
  auto loaded = LoadJournal(dir_.path(), &geometry_);
  ASSERT_TRUE(loaded.ok());
  auto reopened = JournalWriter::Open(dir_.path(), geometry_, loaded->puts);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  writer_ = *std::move(reopened);
  ASSERT_TRUE(writer_->Split(1, geometry_.page_size, next++).ok());
  const std::vector<PutRecord> after = Reload();
  EXPECT_EQ(after.size(), 101u);
}

}  // namespace
}  // namespace hicache::persist
