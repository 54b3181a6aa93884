#include "daemon/persist/journal_reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <random>
#include <string>

#include "absl/time/clock.h"
#include "daemon/persist/state_dir.h"
#include "gtest/gtest.h"
#include "tests/persist/journal_test_util.h"
#include "tests/testing/temp_dir.h"

namespace hicache::persist {
namespace {

using testing::MakePut;
using testing::TestGeometry;

// A journal assembled by hand: header, Geometry, then frames.
struct Builder {
  explicit Builder(const JournalGeometry& g)
      : bytes(EncodeFileHeader() + *EncodeGeometryRecord(g)) {}
  size_t Put(const PutRecord& put) {
    const size_t at = bytes.size();
    bytes += *EncodePutRecord(put);
    return at;
  }
  size_t Drop(uint64_t id) {
    const size_t at = bytes.size();
    bytes += EncodeDropRecord(id);
    return at;
  }
  std::string bytes;
};

std::map<uint64_t, PutRecord> ById(const LoadedJournal& loaded) {
  std::map<uint64_t, PutRecord> out;
  for (const PutRecord& put : loaded.puts) out[put.persist_id] = put;
  return out;
}

TEST(JournalReaderTest, ReplaysPutsAndDropsParentsFirst) {
  std::mt19937_64 rng(1);
  const JournalGeometry g = TestGeometry(2);
  Builder b(g);
  // Children written before their parents; ids not in tree order.
  const PutRecord c = MakePut(30, 20, "a", 2, g, rng);
  const PutRecord p = MakePut(20, 10, "a", 2, g, rng);
  const PutRecord root = MakePut(10, 0, "a", 1, g, rng);
  const PutRecord other = MakePut(5, 0, "b", 3, g, rng);
  const PutRecord gone = MakePut(40, 10, "a", 1, g, rng);
  b.Put(c);
  b.Put(gone);
  b.Put(p);
  b.Put(root);
  b.Put(other);
  b.Drop(40);
  b.Drop(777);  // Never live.
  absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(b.bytes, &g);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->geometry, g);
  EXPECT_TRUE(loaded->stop_reason.empty()) << loaded->stop_reason;
  EXPECT_EQ(loaded->dropped_bytes, 0u);
  EXPECT_EQ(loaded->valid_bytes, b.bytes.size());
  EXPECT_EQ(loaded->records, 8);
  EXPECT_EQ(loaded->unknown_drops, 1);
  EXPECT_EQ(loaded->orphans, 0);
  EXPECT_FALSE(loaded->clean);
  ASSERT_EQ(loaded->puts.size(), 4u);
  // BFS: roots by id (5, 10), then 20, then 30.
  EXPECT_EQ(loaded->puts[0], other);
  EXPECT_EQ(loaded->puts[1], root);
  EXPECT_EQ(loaded->puts[2], p);
  EXPECT_EQ(loaded->puts[3], c);
}

TEST(JournalReaderTest, OrphansAndCrossNamespaceChildrenAreDroppedAndCounted) {
  std::mt19937_64 rng(2);
  const JournalGeometry g = TestGeometry(1);
  Builder b(g);
  b.Put(MakePut(1, 0, "a", 1, g, rng));
  b.Put(MakePut(2, 1, "a", 1, g, rng));
  b.Put(MakePut(3, 2, "a", 1, g, rng));   // Orphaned when 2 is dropped.
  b.Put(MakePut(4, 3, "a", 1, g, rng));   // And its child.
  b.Put(MakePut(5, 1, "b", 1, g, rng));   // Parent in another namespace.
  b.Put(MakePut(6, 99, "a", 1, g, rng));  // Parent never existed.
  b.Put(MakePut(7, 8, "a", 1, g, rng));   // A cycle: 7 -> 8 -> 7.
  b.Put(MakePut(8, 7, "a", 1, g, rng));
  b.Drop(2);
  absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(b.bytes, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->puts.size(), 1u);
  EXPECT_EQ(loaded->puts[0].persist_id, 1u);
  EXPECT_EQ(loaded->orphans, 6);
}

TEST(JournalReaderTest, TornTailAtEveryOffsetKeepsEverythingBefore) {
  std::mt19937_64 rng(3);
  const JournalGeometry g = TestGeometry(4);
  Builder b(g);
  for (uint64_t id = 1; id <= 5; ++id) {
    b.Put(MakePut(id, id - 1, "ns", 4, g, rng));
  }
  b.Drop(5);
  const size_t last = b.Put(MakePut(6, 4, "ns", 8, g, rng));
  for (size_t cut = last; cut < b.bytes.size(); ++cut) {
    absl::StatusOr<LoadedJournal> loaded =
        LoadJournalBytes(absl::string_view(b.bytes).substr(0, cut), &g);
    ASSERT_TRUE(loaded.ok()) << cut << ": " << loaded.status();
    ASSERT_EQ(loaded->puts.size(), 4u) << cut;
    EXPECT_EQ(loaded->valid_bytes, last) << cut;
    EXPECT_EQ(loaded->dropped_bytes, cut - last) << cut;
    if (cut == last) {
      EXPECT_TRUE(loaded->stop_reason.empty());
    } else {
      EXPECT_NE(loaded->stop_reason.find("ends inside a record"),
                std::string::npos)
          << loaded->stop_reason;
    }
  }
  absl::StatusOr<LoadedJournal> whole = LoadJournalBytes(b.bytes, &g);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->puts.size(), 5u);
}

// A corrupt byte in the middle ends the load there: the records before it
// are kept, the damaged one and everything after it are ignored (and
// reported), as for a torn tail. The loader does not resynchronise.
TEST(JournalReaderTest, CorruptByteInTheMiddleStopsThereKeepingThePrefix) {
  std::mt19937_64 rng(4);
  const JournalGeometry g = TestGeometry(1);
  Builder b(g);
  b.Put(MakePut(1, 0, "ns", 2, g, rng));
  b.Put(MakePut(2, 1, "ns", 2, g, rng));
  const size_t bad = b.Put(MakePut(3, 2, "ns", 2, g, rng));
  b.Put(MakePut(4, 3, "ns", 2, g, rng));
  b.Drop(1);
  std::string bytes = b.bytes;
  bytes[bad + 20] = static_cast<char>(bytes[bad + 20] ^ 0x40);
  absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(bytes, &g);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->valid_bytes, bad);
  EXPECT_EQ(loaded->dropped_bytes, bytes.size() - bad);
  EXPECT_NE(loaded->stop_reason.find("checksum mismatch"), std::string::npos)
      << loaded->stop_reason;
  EXPECT_NE(loaded->stop_reason.find("at byte " + std::to_string(bad)),
            std::string::npos)
      << loaded->stop_reason;
  // 1 and 2 survive (the Drop of 1 came after the damage).
  const auto by_id = ById(*loaded);
  EXPECT_EQ(by_id.size(), 2u);
  EXPECT_TRUE(by_id.contains(1));
  EXPECT_TRUE(by_id.contains(2));
}

TEST(JournalReaderTest, ARecordThatFailsValidationEndsTheLoad) {
  std::mt19937_64 rng(5);
  const JournalGeometry g = TestGeometry(2);
  Builder b(g);
  b.Put(MakePut(1, 0, "ns", 2, g, rng));
  // A well-framed Put whose page lies outside the pool.
  PutRecord out_of_pool = MakePut(2, 1, "ns", 2, g, rng);
  out_of_pool.host_pages[out_of_pool.page_owners[0]][0] =
      g.host_pages_per_rank + 5;
  const size_t at = b.Put(out_of_pool);
  b.Put(MakePut(3, 1, "ns", 2, g, rng));
  absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(b.bytes, &g);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->valid_bytes, at);
  EXPECT_NE(loaded->stop_reason.find("outside [0, "), std::string::npos)
      << loaded->stop_reason;
  EXPECT_EQ(loaded->puts.size(), 1u);

  // A second Geometry record, a Clean with a payload, a Drop of id 0.
  for (std::string tail :
       {*EncodeGeometryRecord(g), std::string(), EncodeDropRecord(0)}) {
    if (tail.empty()) {
      ASSERT_TRUE(AppendFrame(RecordType::kClean, "x", &tail).ok());
    }
    Builder c(g);
    c.Put(MakePut(1, 0, "ns", 2, g, rng));
    const size_t bad = c.bytes.size();
    c.bytes += tail;
    absl::StatusOr<LoadedJournal> l = LoadJournalBytes(c.bytes, &g);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->valid_bytes, bad);
    EXPECT_FALSE(l->stop_reason.empty());
    EXPECT_EQ(l->puts.size(), 1u);
  }
}

TEST(JournalReaderTest, AHugeDeclaredLengthEndsTheLoadWithoutAllocating) {
  std::mt19937_64 rng(8);
  const JournalGeometry g = TestGeometry(1);
  Builder b(g);
  b.Put(MakePut(1, 0, "ns", 2, g, rng));
  const size_t at = b.bytes.size();
  for (uint32_t length : {0xffffffffu, 0x80000000u, kMaxPayloadSize + 1}) {
    std::string bytes = b.bytes;
    for (int i = 0; i < 4; ++i) {
      bytes.push_back(static_cast<char>(length >> (8 * i)));
    }
    bytes.push_back(static_cast<char>(RecordType::kPut));
    bytes += std::string(100, 'x');
    absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(bytes, &g);
    ASSERT_TRUE(loaded.ok());
    EXPECT_EQ(loaded->valid_bytes, at);
    EXPECT_EQ(loaded->puts.size(), 1u);
    EXPECT_NE(loaded->stop_reason.find("exceeds"), std::string::npos)
        << loaded->stop_reason;
  }
}

TEST(JournalReaderTest, CleanIsTheLastRecordOnly) {
  std::mt19937_64 rng(6);
  const JournalGeometry g = TestGeometry(1);
  Builder b(g);
  b.Put(MakePut(1, 0, "ns", 2, g, rng));
  b.bytes += EncodeCleanRecord();
  absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(b.bytes, &g);
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(loaded->clean);
  b.Drop(1);
  loaded = LoadJournalBytes(b.bytes, &g);
  ASSERT_TRUE(loaded.ok());
  EXPECT_FALSE(loaded->clean);
  EXPECT_TRUE(loaded->puts.empty());
}

TEST(JournalReaderTest, HeaderProblemsAreErrors) {
  const JournalGeometry g = TestGeometry(1);
  Builder b(g);
  // Geometry mismatch names the field.
  JournalGeometry other = g;
  other.page_size = 32;
  other.kv_fingerprint = 1;
  absl::Status s = LoadJournalBytes(b.bytes, &other).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("page_size: journal 16, daemon 32"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("kv_fingerprint"), std::string::npos) << s;
  // No Geometry first.
  EXPECT_EQ(LoadJournalBytes(EncodeFileHeader(), &g).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadJournalBytes(EncodeFileHeader() + EncodeDropRecord(1), &g)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  // A torn Geometry.
  EXPECT_EQ(LoadJournalBytes(b.bytes.substr(0, b.bytes.size() - 1), &g)
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadJournalBytes("", &g).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadJournalBytes("garbage garbage garbage", &g).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(JournalReaderTest, LoadsFromTheStateDirectory) {
  hicache::testing::TempDir tmp;
  const std::string dir = tmp.Child("state");
  const JournalGeometry g = TestGeometry(1);
  EXPECT_EQ(LoadJournal(dir, &g).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(PrepareStateDir(dir).ok());
  EXPECT_EQ(LoadJournal(dir, &g).status().code(), absl::StatusCode::kNotFound);
  std::mt19937_64 rng(7);
  Builder b(g);
  b.Put(MakePut(1, 0, "ns", 2, g, rng));
  std::ofstream(JournalPath(dir), std::ios::binary) << b.bytes;
  absl::StatusOr<LoadedJournal> loaded = LoadJournal(dir, &g);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->puts.size(), 1u);
  EXPECT_EQ(loaded->file_bytes, b.bytes.size());
  // A directory where the journal should be is not read.
  ASSERT_EQ(::unlink(JournalPath(dir).c_str()), 0);
  ASSERT_EQ(::mkdir(JournalPath(dir).c_str(), 0700), 0);
  EXPECT_FALSE(LoadJournal(dir, &g).ok());
  ASSERT_EQ(::rmdir(JournalPath(dir).c_str()), 0);
  // Nor a FIFO (opening it must not wait for a writer), nor a symlink.
  ASSERT_EQ(::mkfifo(JournalPath(dir).c_str(), 0600), 0);
  EXPECT_EQ(LoadJournal(dir, &g).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(::unlink(JournalPath(dir).c_str()), 0);
  const std::string elsewhere = tmp.Child("elsewhere");
  std::ofstream(elsewhere, std::ios::binary) << b.bytes;
  ASSERT_EQ(::symlink(elsewhere.c_str(), JournalPath(dir).c_str()), 0);
  EXPECT_FALSE(LoadJournal(dir, &g).ok());
}

// One second of mutated journals: the loader returns a Status or a result,
// never crashes, and whatever it keeps is a valid prefix.
TEST(JournalReaderTest, MutatedJournalsNeverCrash) {
  std::mt19937_64 rng(99);
  const JournalGeometry g = TestGeometry(4);
  Builder b(g);
  for (uint64_t id = 1; id <= 20; ++id) {
    b.Put(MakePut(id, id / 2, "ns", 1 + static_cast<int>(id % 5), g, rng));
    if (id % 3 == 0) b.Drop(id - 1);
  }
  const absl::Time end = absl::Now() + absl::Seconds(1);
  int64_t runs = 0;
  while (absl::Now() < end) {
    std::string bytes = b.bytes;
    for (int i = 0, n = 1 + rng() % 8; i < n; ++i) {
      bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    if (rng() % 3 == 0) bytes.resize(rng() % bytes.size());
    absl::StatusOr<LoadedJournal> loaded = LoadJournalBytes(bytes, &g);
    if (loaded.ok()) {
      EXPECT_LE(loaded->valid_bytes, bytes.size());
      EXPECT_EQ(loaded->valid_bytes + loaded->dropped_bytes, bytes.size());
      for (const PutRecord& put : loaded->puts) {
        EXPECT_TRUE(ValidatePut(put, g).ok());
      }
    }
    ++runs;
  }
  EXPECT_GT(runs, 100);
}

}  // namespace
}  // namespace hicache::persist
