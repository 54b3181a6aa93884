#include "daemon/storage/file_page_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <random>
#include <thread>
#include <vector>

#include "daemon/storage/faulty_block_io.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using Io = FilePageStoreOptions::Io;

constexpr int64_t kPageBytes = 6000;  // Not a multiple of 4 KiB: padded slots.

StoreKey Key(uint64_t i) { return StoreKey{i, ~i}; }

std::vector<uint8_t> PageOf(uint64_t i) {
  std::vector<uint8_t> page(kPageBytes);
  std::mt19937_64 rng(i);
  for (auto& b : page) b = static_cast<uint8_t>(rng());
  return page;
}

class FilePageStoreTest : public ::testing::TestWithParam<Io> {
 protected:
  std::unique_ptr<FilePageStore> Open(int64_t capacity,
                                      BlockIoFaults faults = {},
                                      uint64_t format = 1,
                                      FaultyBlockIo** faulty = nullptr) {
    FilePageStoreOptions o;
    o.directory = dir_.Child("l3");
    o.page_bytes = kPageBytes;
    o.capacity_pages = capacity;
    o.format = format;
    o.io = GetParam();
    o.queue_depth = 8;
    o.wrap_io =
        [faults,
         faulty](std::unique_ptr<BlockIo> inner) -> std::unique_ptr<BlockIo> {
      auto f = std::make_unique<FaultyBlockIo>(std::move(inner), faults);
      if (faulty != nullptr) *faulty = f.get();
      return f;
    };
    auto store = FilePageStore::Open(std::move(o));
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  static std::vector<absl::Status> PutPages(
      PageStore& store, const std::vector<uint64_t>& ids,
      std::vector<std::vector<uint8_t>>* keep) {
    std::vector<StorePut> puts;
    for (uint64_t id : ids) {
      keep->push_back(PageOf(id));
      puts.push_back({Key(id), keep->back()});
    }
    return PutAndWait(store, std::move(puts));
  }

  // Reads page `id`: its status, and whether the bytes are right when OK.
  static absl::Status GetPage(PageStore& store, uint64_t id) {
    std::vector<uint8_t> out(kPageBytes, 0);
    absl::Status s = GetAndWait(store, {{Key(id), absl::MakeSpan(out)}})[0];
    if (s.ok() && out != PageOf(id)) {
      return absl::InternalError("WRONG BYTES");
    }
    return s;
  }

  testing::TempDir dir_;
};

TEST_P(FilePageStoreTest, StoresAndReturnsPagesByteExact) {
  auto store = Open(16);
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(8);
  for (const absl::Status& s : PutPages(*store, {1, 2, 3, 4}, &keep)) {
    EXPECT_TRUE(s.ok()) << s;
  }
  for (uint64_t id : {1, 2, 3, 4}) EXPECT_TRUE(GetPage(*store, id).ok());
  EXPECT_EQ(GetPage(*store, 9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ExistsAndWait(*store, {Key(1), Key(9)}),
            (std::vector<bool>{true, false}));
  // A key names its bytes: storing it again changes nothing.
  EXPECT_TRUE(PutPages(*store, {1}, &keep)[0].ok());
  const PageStoreStats stats = store->Stats();
  EXPECT_EQ(stats.puts, 4);
  EXPECT_EQ(stats.put_duplicates, 1);
  EXPECT_EQ(stats.get_hits, 4);
  EXPECT_EQ(stats.get_misses, 1);
  EXPECT_EQ(stats.used_pages, 4);
  EXPECT_TRUE(RemoveAndWait(*store, {Key(2), Key(77)})[0].ok());
  EXPECT_EQ(GetPage(*store, 2).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->CheckInvariants().ok());
}

TEST_P(FilePageStoreTest, RefusesPagesOfTheWrongSize) {
  auto store = Open(4);
  std::vector<uint8_t> small(10), page = PageOf(1);
  auto r = PutAndWait(*store, {{Key(1), small}, {Key(2), page}});
  EXPECT_EQ(r[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r[1].ok());
  auto g = GetAndWait(*store, {{Key(2), absl::MakeSpan(small)}});
  EXPECT_EQ(g[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExistsAndWait(*store, {Key(1)})[0], false);
}

TEST_P(FilePageStoreTest, ARepeatedKeyInOneBatchIsStoredOnce) {
  auto store = Open(4);
  const std::vector<uint8_t> page = PageOf(1);
  auto r = PutAndWait(*store, {{Key(1), page}, {Key(1), page}});
  EXPECT_TRUE(r[0].ok());
  EXPECT_TRUE(r[1].ok());
  EXPECT_EQ(store->Stats().used_pages, 1);
  EXPECT_TRUE(GetPage(*store, 1).ok());
}

TEST_P(FilePageStoreTest, EvictsTheLeastRecentlyUsedWhenFull) {
  auto store = Open(3);
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(8);
  PutPages(*store, {1, 2, 3}, &keep);
  ASSERT_TRUE(GetPage(*store, 1).ok());  // 2 is now the oldest.
  EXPECT_TRUE(PutPages(*store, {4}, &keep)[0].ok());
  EXPECT_EQ(GetPage(*store, 2).code(), absl::StatusCode::kNotFound);
  for (uint64_t id : {1, 3, 4}) EXPECT_TRUE(GetPage(*store, id).ok()) << id;
  EXPECT_EQ(store->Stats().evictions, 1);
}

TEST_P(FilePageStoreTest, SurvivesARestart) {
  {
    auto store = Open(8);
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(8);
    PutPages(*store, {1, 2, 3}, &keep);
  }
  auto store = Open(8);
  EXPECT_EQ(store->open_report().entries, 3);
  for (uint64_t id : {1, 2, 3}) EXPECT_TRUE(GetPage(*store, id).ok()) << id;
}

TEST_P(FilePageStoreTest, SurvivesSigkill) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = Open(8);
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(8);
    for (const absl::Status& s : PutPages(*store, {5, 6}, &keep)) {
      if (!s.ok()) ::_exit(1);
    }
    ::raise(SIGKILL);  // No destructor, no flush beyond what Put did.
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  auto store = Open(8);
  EXPECT_TRUE(GetPage(*store, 5).ok());
  EXPECT_TRUE(GetPage(*store, 6).ok());
}

TEST_P(FilePageStoreTest, AnotherFormatStartsEmpty) {
  {
    auto store = Open(8, {}, /*format=*/1);
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(1);
    PutPages(*store, {1}, &keep);
  }
  auto store = Open(8, {}, /*format=*/2);
  EXPECT_FALSE(store->open_report().discarded.empty());
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kNotFound);
}

TEST_P(FilePageStoreTest, FlippedBitsAreMissesAndTheEntryGoes) {
  FaultyBlockIo* faulty = nullptr;
  auto store = Open(8, {.flip_read_every = 2}, 1, &faulty);
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(1);
  PutPages(*store, {1}, &keep);
  EXPECT_TRUE(GetPage(*store, 1).ok());  // Read 0: clean.
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(faulty->injected().flipped_reads, 1);
  EXPECT_EQ(store->Stats().checksum_failures, 1);
  EXPECT_TRUE(store->CheckInvariants().ok());
}

TEST_P(FilePageStoreTest, TornWritesAreMisses) {
  auto store = Open(8, {.tear_write_every = 1});
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(1);
  EXPECT_TRUE(PutPages(*store, {1}, &keep)[0].ok());  // The device said so.
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kNotFound);
}

TEST_P(FilePageStoreTest, IoErrorsStoreNothingAndReturnErrors) {
  auto store = Open(8, {.fail_write_every = 2, .fail_read_every = 2});
  std::vector<std::vector<uint8_t>> keep;
  keep.reserve(2);
  auto r = PutPages(*store, {1, 2}, &keep);
  EXPECT_TRUE(r[0].ok());
  EXPECT_EQ(r[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ExistsAndWait(*store, {Key(2)})[0], false);
  EXPECT_TRUE(GetPage(*store, 1).ok());  // Read 0.
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(GetPage(*store, 1).ok());  // Still there: an I/O error is not
                                         // corruption.
  const PageStoreStats stats = store->Stats();
  EXPECT_EQ(stats.put_errors, 1);
  EXPECT_EQ(stats.get_errors, 1);
  EXPECT_EQ(stats.used_pages, 1);
  EXPECT_TRUE(store->CheckInvariants().ok());
}

TEST_P(FilePageStoreTest, CorruptionOnDiskIsAMiss) {
  {
    auto store = Open(2);
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(2);
    PutPages(*store, {1, 2}, &keep);
  }
  const std::string data = dir_.Child("l3") + "/pages.data";
  const int fd = ::open(data.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  // Zero the start of both slots (8 KiB each for 6,000-byte pages).
  std::vector<char> zeros(100, 0);
  ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), 0), 100);
  ASSERT_EQ(::pwrite(fd, zeros.data(), zeros.size(), 8192 + 5000), 100);
  ::close(fd);
  auto store = Open(2);
  EXPECT_EQ(GetPage(*store, 1).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(GetPage(*store, 2).code(), absl::StatusCode::kDataLoss);
}

TEST_P(FilePageStoreTest, OneProcessAtATime) {
  auto store = Open(2);
  FilePageStoreOptions o;
  o.directory = dir_.Child("l3");
  o.page_bytes = kPageBytes;
  o.capacity_pages = 2;
  o.io = GetParam();
  EXPECT_EQ(FilePageStore::Open(o).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(FilePageStoreTest, RefusesBadOptionsAndMissingSpace) {
  FilePageStoreOptions o;
  o.directory = dir_.Child("l3");
  o.page_bytes = kPageBytes;
  o.capacity_pages = 0;
  o.io = GetParam();
  EXPECT_EQ(FilePageStore::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.capacity_pages = int64_t{1} << 40;  // 8 PiB of 8 KiB slots.
  EXPECT_EQ(FilePageStore::Open(o).status().code(),
            absl::StatusCode::kResourceExhausted);
  o.capacity_pages = int64_t{1} << 62;
  EXPECT_EQ(FilePageStore::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.capacity_pages = 1;
  o.directory = "";
  EXPECT_EQ(FilePageStore::Open(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Concurrent random puts, gets and removes from four threads against
// pages that are a function of their key: every OK get is byte-exact,
// with faults injected throughout; nothing leaks.
TEST_P(FilePageStoreTest, ConcurrentTrafficWithFaultsNeverReturnsWrongBytes) {
  auto store = Open(32, {.fail_write_every = 7,
                         .fail_read_every = 11,
                         .tear_write_every = 5,
                         .flip_read_every = 13});
  std::vector<std::thread> threads;
  std::atomic<int64_t> ok_gets{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int step = 0; step < 300; ++step) {
        const uint64_t id = rng() % 64;
        switch (rng() % 3) {
          case 0: {
            std::vector<std::vector<uint8_t>> keep;
            keep.reserve(4);
            PutPages(*store, {id, id + 1, id + 2}, &keep);
            break;
          }
          case 1: {
            const absl::Status s = GetPage(*store, id);
            ASSERT_NE(s.code(), absl::StatusCode::kInternal) << s;
            if (s.ok()) ++ok_gets;
            break;
          }
          case 2:
            RemoveAndWait(*store, {Key(id)});
            break;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(ok_gets.load(), 0);
  EXPECT_TRUE(store->CheckInvariants().ok());
  const PageStoreStats stats = store->Stats();
  EXPECT_LE(stats.used_pages, 32);
  EXPECT_GT(stats.checksum_failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Io, FilePageStoreTest,
                         ::testing::Values(Io::kUring, Io::kThreads),
                         [](const auto& info) {
                           return info.param == Io::kUring ? "IoUring"
                                                           : "Threads";
                         });

}  // namespace
}  // namespace hicache
