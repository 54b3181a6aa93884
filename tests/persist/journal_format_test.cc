#include "daemon/persist/journal_format.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/persist/journal_test_util.h"

namespace hicache::persist {
namespace {

using testing::MakePut;
using testing::TestGeometry;

void PutLe32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}
void PutLe64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>(v >> (8 * i)));
}

TEST(JournalFormatTest, FileHeaderRoundTripAndRejections) {
  const std::string header = EncodeFileHeader();
  ASSERT_EQ(header.size(), kFileHeaderSize);
  EXPECT_EQ(header.substr(0, 8), "HCJOURNL");
  EXPECT_TRUE(CheckFileHeader(header).ok());
  EXPECT_EQ(CheckFileHeader(header.substr(0, 15)).code(),
            absl::StatusCode::kDataLoss);
  std::string bad_magic = header;
  bad_magic[0] = 'X';
  EXPECT_EQ(CheckFileHeader(bad_magic).code(), absl::StatusCode::kDataLoss);
  // Version 1 (tokens in the records) and a future version 3 are refused.
  for (char version : {1, 3}) {
    std::string other = header;
    other[8] = version;
    const absl::Status s = CheckFileHeader(other);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find(absl::StrCat("version ", static_cast<int>(version))),
              std::string::npos)
        << s;
  }
}

// ForEachPage walks a Put in position order: each page's owner, its index
// in the owner's lists, and the tokens it holds (the last page fewer).
TEST(JournalFormatTest, ForEachPageWalksPositionsInOrder) {
  PutRecord put;
  put.persist_id = 1;
  put.logical_len = 10;  // Pages of 4: 4, 4, 2 tokens.
  put.page_owners = {1, 0, 1};
  put.host_pages = {{70}, {80, 81}};
  put.checksums = {{7}, {8, 9}};
  std::vector<std::vector<size_t>> seen;
  EXPECT_TRUE(ForEachPage(put, 4, [&](const PutPage& page) {
    seen.push_back({page.position, page.rank, page.index, page.tokens});
  }));
  EXPECT_EQ(seen, (std::vector<std::vector<size_t>>{
                      {0, 1, 0, 4}, {1, 0, 0, 4}, {2, 1, 1, 2}}));
  // Misshapen (as ValidatePut would say): an owner without a list, or past
  // its list's end, stops the walk with false.
  PutRecord foreign = put;
  foreign.page_owners = {1, 2, 1};
  int calls = 0;
  EXPECT_FALSE(ForEachPage(foreign, 4, [&](const PutPage&) { ++calls; }));
  EXPECT_EQ(calls, 1);
  PutRecord short_list = put;
  short_list.host_pages[1].pop_back();
  calls = 0;
  EXPECT_FALSE(ForEachPage(short_list, 4, [&](const PutPage&) { ++calls; }));
  EXPECT_EQ(calls, 2);
}

TEST(JournalFormatTest, GeometryRoundTrip) {
  JournalGeometry g = TestGeometry(4);
  g.instance = std::string("bytes\0\xff not utf8", 16);
  absl::StatusOr<std::string> frame = EncodeGeometryRecord(g);
  ASSERT_TRUE(frame.ok());
  absl::StatusOr<Frame> parsed = ParseFrame(*frame);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->type, RecordType::kGeometry);
  EXPECT_EQ(parsed->size, frame->size());
  absl::StatusOr<JournalGeometry> back = DecodeGeometryPayload(parsed->payload);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, g);
}

TEST(JournalFormatTest, PutRoundTripForEveryCpSize) {
  std::mt19937_64 rng(7);
  for (uint32_t cp : {1u, 2u, 4u, 8u}) {
    const JournalGeometry g = TestGeometry(cp);
    for (int pages : {1, 3, 16, 100}) {
      const PutRecord put = MakePut(42, 7, "ns/é", pages, g, rng);
      ASSERT_TRUE(ValidatePut(put, g).ok()) << ValidatePut(put, g);
      absl::StatusOr<std::string> frame = EncodePutRecord(put);
      ASSERT_TRUE(frame.ok()) << frame.status();
      absl::StatusOr<Frame> parsed = ParseFrame(*frame);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->type, RecordType::kPut);
      absl::StatusOr<PutRecord> back = DecodePutPayload(parsed->payload);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, put);
      uint64_t id = 0, parent = 0;
      ASSERT_TRUE(PeekPutIds(parsed->payload, &id, &parent).ok());
      EXPECT_EQ(id, 42u);
      EXPECT_EQ(parent, 7u);
    }
  }
}

// The wire format, byte for byte (little-endian whatever the host).
TEST(JournalFormatTest, PutPayloadBytesAreTheDocumentedFormat) {
  PutRecord put;
  put.persist_id = 0x0102030405060708ull;
  put.parent_persist_id = 9;
  put.name_space = "ab";
  put.logical_len = 20;
  put.page_owners = {1, 0};
  put.host_pages = {{7}, {0x0a0b0c0d0e0f1011ll}};
  put.checksums = {{0xdeadbeefull}, {42}};
  std::string want;
  PutLe64(&want, 0x0102030405060708ull);
  PutLe64(&want, 9);
  PutLe32(&want, 2);
  want += "ab";
  PutLe64(&want, 20);
  PutLe32(&want, 2);
  PutLe32(&want, 1);
  PutLe32(&want, 0);
  PutLe32(&want, 2);  // Ranks.
  PutLe32(&want, 1);
  PutLe64(&want, 7);
  PutLe32(&want, 1);
  PutLe64(&want, 0xdeadbeefull);
  PutLe32(&want, 1);
  PutLe64(&want, 0x0a0b0c0d0e0f1011ull);
  PutLe32(&want, 1);
  PutLe64(&want, 42);
  absl::StatusOr<std::string> got = EncodePutPayload(put);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, want);
  absl::StatusOr<PutRecord> back = DecodePutPayload(want);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, put);
  // The frame: length, type, payload, XXH3-64 of the three.
  absl::StatusOr<std::string> frame = EncodePutRecord(put);
  ASSERT_TRUE(frame.ok());
  std::string prefix;
  PutLe32(&prefix, static_cast<uint32_t>(want.size()));
  prefix.push_back(static_cast<char>(RecordType::kPut));
  EXPECT_EQ(frame->substr(0, 5), prefix);
  EXPECT_EQ(frame->substr(5, want.size()), want);
  EXPECT_EQ(frame->size(), want.size() + kFrameOverhead);
}

// Every record's bytes, frame and checksum included, pinned: computed with
// the hand-written encoder that preceded le_bytes, so a codec change that
// moves a byte (and would strand existing journals) fails here.
TEST(JournalFormatTest, RecordBytesArePinned) {
  EXPECT_EQ(absl::BytesToHexString(EncodeFileHeader()),
            "48434a4f55524e4c0200000000000000");
  const JournalGeometry g{.page_size = 64,
                          .cp_size = 2,
                          .kv_fingerprint = 0xfedcba9876543210ull,
                          .host_layout = "layer_first",
                          .host_pages_per_rank = 1000,
                          .instance = std::string("in\0st", 5)};
  absl::StatusOr<std::string> geometry = EncodeGeometryRecord(g);
  ASSERT_TRUE(geometry.ok()) << geometry.status();
  EXPECT_EQ(absl::BytesToHexString(*geometry),
            "300000000140000000020000001032547698badcfe0b0000006c617965725f66"
            "69727374e80300000000000005000000696e00737471bbc2708805b777");
  PutRecord put;
  put.persist_id = 0x0102030405060708ull;
  put.parent_persist_id = 3;
  put.name_space = "ns";
  put.logical_len = 130;
  put.page_owners = {0, 1, 0};
  put.host_pages = {{7, 8}, {0x0a0b0c0d0e0f1011ll}};
  put.checksums = {{0xdeadbeefull, 1}, {42}};
  absl::StatusOr<std::string> record = EncodePutRecord(put);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(absl::BytesToHexString(*record),
            "720000000208070605040302010300000000000000020000006e738200000000"
            "0000000300000000000000010000000000000002000000020000000700000000"
            "000000080000000000000002000000efbeadde00000000010000000000000001"
            "00000011100f0e0d0c0b0a010000002a000000000000004b4fcbd753b61698");
  EXPECT_EQ(absl::BytesToHexString(EncodeDropRecord(0xfedcba9876543210ull)),
            "08000000031032547698badcfe3b233d7a718b34f9");
  EXPECT_EQ(absl::BytesToHexString(EncodeCleanRecord()),
            "0000000004dfb3a9eccc2b6935");
  // And they decode.
  absl::StatusOr<Frame> frame = ParseFrame(*geometry);
  ASSERT_TRUE(frame.ok()) << frame.status();
  absl::StatusOr<JournalGeometry> decoded =
      DecodeGeometryPayload(frame->payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, g);
  frame = ParseFrame(*record);
  ASSERT_TRUE(frame.ok()) << frame.status();
  absl::StatusOr<PutRecord> decoded_put = DecodePutPayload(frame->payload);
  ASSERT_TRUE(decoded_put.ok()) << decoded_put.status();
  EXPECT_EQ(*decoded_put, put);
}

TEST(JournalFormatTest, DropAndCleanRoundTrip) {
  const std::string drop = EncodeDropRecord(0xfedcba9876543210ull);
  absl::StatusOr<Frame> parsed = ParseFrame(drop);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->type, RecordType::kDrop);
  absl::StatusOr<uint64_t> id = DecodeDropPayload(parsed->payload);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, 0xfedcba9876543210ull);
  EXPECT_EQ(DecodeDropPayload(EncodeDropPayload(0)).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeDropPayload("1234567").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeDropPayload("123456789").status().code(),
            absl::StatusCode::kDataLoss);
  absl::StatusOr<Frame> clean = ParseFrame(EncodeCleanRecord());
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(clean->type, RecordType::kClean);
  EXPECT_EQ(clean->size, kFrameOverhead);
}

TEST(JournalFormatTest, EncodePutRejectsBadShapes) {
  std::mt19937_64 rng(1);
  const JournalGeometry g = TestGeometry(2);
  PutRecord put = MakePut(5, 0, "ns", 4, g, rng);
  PutRecord zero = put;
  zero.persist_id = 0;
  EXPECT_EQ(EncodePutRecord(zero).status().code(),
            absl::StatusCode::kInvalidArgument);
  PutRecord self = put;
  self.parent_persist_id = 5;
  EXPECT_EQ(EncodePutRecord(self).status().code(),
            absl::StatusCode::kInvalidArgument);
  PutRecord fewer_lists = put;
  fewer_lists.checksums.pop_back();
  EXPECT_EQ(EncodePutRecord(fewer_lists).status().code(),
            absl::StatusCode::kInvalidArgument);
  PutRecord short_list = put;
  short_list.checksums[0].pop_back();
  EXPECT_EQ(EncodePutRecord(short_list).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Too big for one record.
  PutRecord huge = put;
  huge.page_owners.assign(kMaxPayloadSize / 4 + 1, 0);
  EXPECT_EQ(EncodePutRecord(huge).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string out;
  EXPECT_EQ(
      AppendFrame(RecordType::kPut, std::string(kMaxPayloadSize + 1, 'x'), &out)
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

TEST(JournalFormatTest, ValidatePutChecksTheGeometry) {
  std::mt19937_64 rng(2);
  const JournalGeometry g = TestGeometry(4);
  const PutRecord good = MakePut(9, 3, "ns", 8, g, rng);
  ASSERT_TRUE(ValidatePut(good, g).ok());
  auto expect_bad = [&](PutRecord put, const std::string& what) {
    const absl::Status s = ValidatePut(put, g);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << what;
    EXPECT_NE(s.message().find(what), std::string::npos) << s;
  };
  PutRecord p = good;
  p.logical_len = 0;
  expect_bad(p, "logical_len 0");
  p = good;
  p.logical_len += g.page_size;  // One more page than owners.
  expect_bad(p, "page owners for logical_len");
  p = good;
  p.page_owners[0] = 4;
  expect_bad(p, "owner rank 4 >= cp_size 4");
  p = good;
  p.host_pages.pop_back();
  p.checksums.pop_back();
  expect_bad(p, "page lists for cp_size 4");
  p = good;
  p.host_pages[p.page_owners[0]][0] = g.host_pages_per_rank;
  expect_bad(p, "outside [0, ");
  p = good;
  p.host_pages[p.page_owners[0]][0] = -1;
  expect_bad(p, "page -1 outside");
  p = good;
  p.checksums[p.page_owners[0]].pop_back();
  expect_bad(p, "checksums/pages shape");
  p = good;
  // Rank of page 0 claims page 1's page: counts per rank no longer agree.
  p.page_owners[0] = (p.page_owners[0] + 1) % 4;
  expect_bad(p, "pages but owns");
}

TEST(JournalFormatTest, CompareGeometryNamesEveryField) {
  const JournalGeometry a = TestGeometry(1);
  EXPECT_TRUE(CompareGeometry(a, a).ok());
  JournalGeometry b = a;
  b.page_size = 32;
  b.instance = "other";
  const absl::Status s = CompareGeometry(a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("page_size: journal 16, daemon 32"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("instance: journal test-instance, daemon other"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("cp_size"), std::string::npos) << s;
}

TEST(JournalFormatTest, ParseFrameDetectsTornAndCorruptFrames) {
  std::mt19937_64 rng(3);
  const std::string frame =
      *EncodePutRecord(MakePut(1, 0, "ns", 4, TestGeometry(), rng));
  // Every proper prefix is torn.
  for (size_t n = 0; n < frame.size(); ++n) {
    EXPECT_EQ(ParseFrame(frame.substr(0, n)).status().code(),
              absl::StatusCode::kOutOfRange)
        << n;
  }
  // Every single flipped bit is caught (the length, type, payload or sum).
  for (size_t i = 0; i < frame.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = frame;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      absl::StatusOr<Frame> parsed = ParseFrame(bad);
      EXPECT_FALSE(parsed.ok()) << i << ":" << bit;
    }
  }
  // A frame followed by more bytes parses as itself.
  absl::StatusOr<Frame> parsed = ParseFrame(frame + "trailing");
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->size, frame.size());
}

TEST(JournalFormatTest, HugeLengthsAreRefusedBeforeAnyAllocation) {
  for (uint32_t length : {0xffffffffu, 0xfffffff0u, kMaxPayloadSize + 1}) {
    std::string bytes;
    PutLe32(&bytes, length);
    bytes.push_back(static_cast<char>(RecordType::kPut));
    bytes += std::string(64, '\0');
    EXPECT_EQ(ParseFrame(bytes).status().code(), absl::StatusCode::kDataLoss)
        << length;
  }
  // A valid frame of an unknown type.
  std::string out;
  ASSERT_TRUE(AppendFrame(static_cast<RecordType>(9), "x", &out).ok());
  EXPECT_EQ(ParseFrame(out).status().code(), absl::StatusCode::kDataLoss);
}

// Payloads whose counts claim more than the bytes hold: decoding fails
// without allocating what they claim.
TEST(JournalFormatTest, HostilePutPayloadsFail) {
  auto header = [](uint32_t ns_len) {
    std::string p;
    PutLe64(&p, 1);
    PutLe64(&p, 0);
    PutLe32(&p, ns_len);
    return p;
  };
  std::string p = header(0xffffffffu);  // Namespace longer than the payload.
  EXPECT_EQ(DecodePutPayload(p).status().code(), absl::StatusCode::kDataLoss);

  p = header(0);
  PutLe64(&p, 16);          // logical_len.
  PutLe32(&p, 0x40000000);  // 1G owners.
  EXPECT_EQ(DecodePutPayload(p).status().code(), absl::StatusCode::kDataLoss);

  p = header(0);
  PutLe64(&p, 16);
  PutLe32(&p, 1);
  PutLe32(&p, 0);            // Owner 0.
  PutLe32(&p, 0xffffffffu);  // 4G ranks.
  EXPECT_EQ(DecodePutPayload(p).status().code(), absl::StatusCode::kDataLoss);

  // One rank: one page, two checksums.
  p = header(0);
  PutLe64(&p, 16);
  PutLe32(&p, 1);
  PutLe32(&p, 0);
  PutLe32(&p, 1);
  PutLe32(&p, 1);
  PutLe64(&p, 5);
  PutLe32(&p, 2);
  PutLe64(&p, 1);
  PutLe64(&p, 2);
  absl::Status s = DecodePutPayload(p).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("1 pages but 2 checksums"), std::string::npos)
      << s;

  // Trailing bytes.
  std::mt19937_64 rng(4);
  std::string good =
      *EncodePutPayload(MakePut(1, 0, "n", 2, TestGeometry(), rng));
  EXPECT_EQ(DecodePutPayload(good + "x").status().code(),
            absl::StatusCode::kDataLoss);
  // Every truncation of a good payload fails.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodePutPayload(good.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeGeometryPayload("short").ok());
}

TEST(JournalFormatTest, HostileGeometriesFail) {
  const JournalGeometry good = TestGeometry(4);
  ASSERT_TRUE(ValidateGeometry(good).ok());
  for (auto mutate : std::vector<void (*)(JournalGeometry*)>{
           [](JournalGeometry* g) { g->page_size = 0; },
           [](JournalGeometry* g) { g->cp_size = 0; },
           [](JournalGeometry* g) { g->cp_size = kMaxCpSize + 1; },
           [](JournalGeometry* g) { g->cp_size = 0xffffffffu; },
           [](JournalGeometry* g) { g->host_pages_per_rank = -1; }}) {
    JournalGeometry g = good;
    mutate(&g);
    EXPECT_EQ(ValidateGeometry(g).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(DecodeGeometryPayload(EncodeGeometryPayload(g)).status().code(),
              absl::StatusCode::kDataLoss);
    // ValidatePut refuses to work with it (no cp_size-sized allocation).
    std::mt19937_64 rng(8);
    EXPECT_FALSE(ValidatePut(MakePut(1, 0, "n", 1, good, rng), g).ok());
  }
}

TEST(JournalFormatTest, APutWithMoreRanksThanAnyGeometryFails) {
  std::string p;
  PutLe64(&p, 1);
  PutLe64(&p, 0);
  PutLe32(&p, 0);  // Namespace.
  PutLe32(&p, 0);  // Tokens.
  PutLe64(&p, 16);
  PutLe32(&p, 0);  // Owners.
  PutLe32(&p, kMaxCpSize + 1);
  for (uint32_t r = 0; r <= kMaxCpSize; ++r) {
    PutLe32(&p, 0);
    PutLe32(&p, 0);
  }
  EXPECT_EQ(DecodePutPayload(p).status().code(), absl::StatusCode::kDataLoss);
}

// One second of random and mutated input: nothing crashes (run under ASan
// too), every result is a Status.
TEST(JournalFormatTest, RandomBytesNeverCrash) {
  std::mt19937_64 rng(12345);
  const JournalGeometry g = TestGeometry(4);
  const std::string seed = *EncodePutPayload(MakePut(3, 1, "ns", 6, g, rng));
  const absl::Time end = absl::Now() + absl::Seconds(1);
  int64_t iterations = 0;
  while (absl::Now() < end) {
    std::string bytes;
    if (rng() % 2 == 0) {
      bytes.resize(rng() % 256);
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {
      bytes = seed;
      for (int i = 0, n = 1 + rng() % 4; i < n; ++i) {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      }
      bytes.resize(rng() % (bytes.size() + 1));
    }
    absl::StatusOr<PutRecord> put = DecodePutPayload(bytes);
    if (put.ok()) (void)ValidatePut(*put, g);
    (void)DecodeGeometryPayload(bytes);
    (void)DecodeDropPayload(bytes);
    (void)ParseFrame(bytes);
    ++iterations;
  }
  EXPECT_GT(iterations, 1000);
}

}  // namespace
}  // namespace hicache::persist
