// CopyTally (the digest's per-rank accounting) and the wire form of the
// Digest (kind 9) and DigestResult (kind 10) frames: round trips, bounds,
// and hostile bytes.
#include "daemon/group/copy_digest.h"

#include <cstring>
#include <string>
#include <vector>

#include "daemon/group/group_wire.h"
#include "gtest/gtest.h"
#include "tests/group/group_test_util.h"

namespace hicache::group {
namespace {

using testing::MakeTask;

constexpr auto kD2H = TransferDirection::kDeviceToHost;
constexpr auto kH2D = TransferDirection::kHostToDevice;

CopyTally Tally() { return CopyTally({3, 2}, 32, 64); }

TEST(CopyTallyTest, CountsByDirectionAndRank) {
  CopyTally t = Tally();
  t.CountFrame();
  t.AddTask(MakeTask(1, 0, {2, 3}, 4, kD2H));
  t.AddTask(MakeTask(2, 1, {3}, 5, kH2D));
  t.AddRefused(2);
  t.AddRefused(7);  // Not accounted: ignored.
  t.Add(3, kD2H, 0, RankCopy{.rank = 9});
  const Digest d = t.Snapshot();
  EXPECT_EQ(d.tasks_frames, 1u);
  ASSERT_EQ(d.ranks.size(), 2u);
  EXPECT_EQ(d.ranks[0].rank, 2u);  // Ascending.
  EXPECT_EQ(d.ranks[0].copies_d2h, 1u);
  EXPECT_EQ(d.ranks[0].pages_d2h, 4u);
  EXPECT_EQ(d.ranks[0].copies_h2d, 0u);
  EXPECT_EQ(d.ranks[0].refused, 1u);
  EXPECT_EQ(d.ranks[0].device_pages_per_rank, 32u);
  EXPECT_EQ(d.ranks[0].host_pages_per_rank, 64u);
  EXPECT_EQ(d.ranks[1].rank, 3u);
  EXPECT_EQ(d.ranks[1].copies_d2h, 1u);
  EXPECT_EQ(d.ranks[1].copies_h2d, 1u);
  EXPECT_EQ(d.ranks[1].pages_h2d, 5u);
  EXPECT_NE(d.ranks[0].hash, 0u);
}

// The hashes, pinned: computed with the hand-written little-endian encoding
// that preceded le_bytes, so a codec change that moves a byte fails here.
TEST(CopyTallyTest, HashesArePinned) {
  const RankCopy copy{.rank = 1,
                      .device_pages = {100, 101, 5, 1 << 20},
                      .host_pages = {7, -3, 1000000},
                      .wait_fence = 77};
  EXPECT_EQ(CopyHash(9, kH2D, 3, copy), uint64_t{0x7d08335fb0a60213});
  // More than one 64-value block per list.
  RankCopy big{.rank = 2};
  for (int i = 0; i < 200; ++i) {
    big.device_pages.push_back(i * 7);
    big.host_pages.push_back(-i);
  }
  EXPECT_EQ(CopyHash(~uint64_t{0}, kD2H, 0, big), uint64_t{0xc6b28702e401de9a});
  CopyTally t({0, 1, 2}, 10, 20);
  TransferTask task{.op_id = 9, .direction = kH2D, .step = 3};
  task.ranks = {copy, RankCopy{.rank = 0xffffffffu, .host_pages = {5}}};
  t.AddTask(task);
  t.AddTask(TransferTask{.op_id = 3, .ranks = {RankCopy{.rank = 1}}});
  const Digest d = t.Snapshot();
  ASSERT_EQ(d.ranks.size(), 3u);
  EXPECT_EQ(d.ranks[0].hash, 0u);
  EXPECT_EQ(d.ranks[1].hash, uint64_t{0x63d23d28eb9c7496});
  EXPECT_EQ(d.ranks[2].hash, 0u);
}

TEST(CopyTallyTest, SameStreamSameDigestAnyChangeDiffers) {
  auto stream = [](CopyTally& t, int variant) {
    TransferTask a = MakeTask(10, 2, {2, 3}, 6, kD2H);
    TransferTask b = MakeTask(11, 3, {2}, 6, kH2D);
    if (variant == 1) a.ranks[0].host_pages[5] += 1;  // One page differs.
    if (variant == 2) std::swap(a, b);                // Another order.
    if (variant == 3) b.op_id = 12;                   // Another op.
    if (variant == 4) b.step = 4;                     // Another step.
    t.AddTask(a);
    t.AddTask(b);
  };
  CopyTally base = Tally();
  stream(base, 0);
  CopyTally same = Tally();
  stream(same, 0);
  EXPECT_EQ(base.Snapshot(), same.Snapshot());
  for (int variant = 1; variant <= 4; ++variant) {
    CopyTally other = Tally();
    stream(other, variant);
    EXPECT_NE(other.Snapshot().ranks[0].hash, base.Snapshot().ranks[0].hash)
        << variant;
    // The counts alone would not see it.
    EXPECT_EQ(other.Snapshot().ranks[0].pages_d2h,
              base.Snapshot().ranks[0].pages_d2h);
  }
  // The hash is a fixed function of the stream (the same on every daemon of
  // one build): a long page list hashes in chunks the same way.
  RankCopy wide{.rank = 2};
  for (int i = 0; i < 200; ++i) {
    wide.device_pages.push_back(i);
    wide.host_pages.push_back(1000 - i);
  }
  EXPECT_EQ(CopyHash(1, kD2H, 0, wide), CopyHash(1, kD2H, 0, wide));
  RankCopy wider = wide;
  wider.host_pages[199] = 7;
  EXPECT_NE(CopyHash(1, kD2H, 0, wide), CopyHash(1, kD2H, 0, wider));
  EXPECT_NE(CopyHash(1, kD2H, 0, wide), CopyHash(1, kH2D, 0, wide));
}

TEST(CopyTallyTest, DescribeDivergenceNamesEveryField) {
  CopyTally leader = CopyTally({2, 3}, 0, 64);  // Device pages not known.
  CopyTally follower = Tally();
  for (CopyTally* t : {&leader, &follower}) {
    t->CountFrame();
    t->AddTask(MakeTask(1, 0, {2, 3}, 4));
  }
  const Digest l = leader.Snapshot();
  Digest f = follower.Snapshot();
  EXPECT_EQ(DescribeDivergence(l.tasks_frames, l.ranks, f.tasks_frames,
                               f.ranks),
            "");  // Unknown geometry is not compared.
  follower.SkewForTesting(3, 1);
  follower.AddRefused(2);
  follower.CountFrame();
  f = follower.Snapshot();
  f.ranks[1].host_pages_per_rank = 63;
  const std::string diff =
      DescribeDivergence(l.tasks_frames, l.ranks, f.tasks_frames, f.ranks);
  EXPECT_NE(diff.find("tasks frames: leader 1, follower 2"), std::string::npos)
      << diff;
  EXPECT_NE(diff.find("rank 2 copies refused: leader 0, follower 1"),
            std::string::npos)
      << diff;
  EXPECT_NE(diff.find("rank 3 host pages per rank: leader 64, follower 63"),
            std::string::npos)
      << diff;
  EXPECT_NE(diff.find("rank 3 pages device->host: leader 4, follower 5"),
            std::string::npos)
      << diff;
  EXPECT_EQ(diff.find("device pages per rank"), std::string::npos) << diff;
  // Ranks on one side only.
  std::vector<RankTally> fewer = {l.ranks[0]};
  std::vector<RankTally> more = l.ranks;
  more.push_back(RankTally{.rank = 5});
  EXPECT_EQ(DescribeDivergence(1, l.ranks, 1, fewer),
            "rank 3: not accounted by the follower");
  EXPECT_EQ(DescribeDivergence(1, l.ranks, 1, more),
            "rank 5: not accounted by the leader");
  EXPECT_NE(DescribeTallies(l.ranks).find("rank 2: copies d2h 1 h2d 0"),
            std::string::npos)
      << DescribeTallies(l.ranks);
}

// ---- Wire ----------------------------------------------------------------

Digest SampleDigest() {
  CopyTally t = Tally();
  t.CountFrame();
  t.AddTask(MakeTask(1, 0, {2, 3}, 4));
  t.AddRefused(3);
  Digest d = t.Snapshot();
  d.tasks_frames = 0x0102030405060708ull;
  d.ranks[1].hash = ~uint64_t{0};
  return d;
}

TEST(DigestWireTest, RoundTripsAndSizes) {
  const Digest d = SampleDigest();
  const std::string bytes = EncodeFrame(4, 9, d);
  EXPECT_EQ(bytes.size(), kFrameHeaderBytes + 8 + 4 + 68 * 2);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1]), 9);
  absl::StatusOr<Frame> frame = DecodeFrame(bytes);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->header.kind, FrameKind::kDigest);
  EXPECT_EQ(std::get<Digest>(frame->body), d);
  EXPECT_EQ(EncodeFrame(*frame), bytes);

  const DigestResult r{.tasks_frames = 77, .match = true, .ranks = d.ranks};
  const std::string rbytes = EncodeFrame(4, 10, r);
  EXPECT_EQ(rbytes.size(), kFrameHeaderBytes + 8 + 1 + 4 + 68 * 2);
  EXPECT_EQ(static_cast<uint8_t>(rbytes[1]), 10);
  absl::StatusOr<Frame> rframe = DecodeFrame(rbytes);
  ASSERT_TRUE(rframe.ok()) << rframe.status();
  EXPECT_EQ(std::get<DigestResult>(rframe->body), r);
  EXPECT_TRUE(SameFrame(*rframe, *rframe));
  EXPECT_EQ(FrameKindName(9), "digest");
  EXPECT_EQ(FrameKindName(10), "digest_result");
  EXPECT_EQ(FrameKindName(11), "kind 11");
  // An empty digest is a digest.
  ASSERT_TRUE(DecodeFrame(EncodeFrame(1, 1, Digest{})).ok());
}

TEST(DigestWireTest, EveryTruncationIsDataLoss) {
  for (const std::string& bytes :
       {EncodeFrame(4, 9, SampleDigest()),
        EncodeFrame(4, 9, DigestResult{.ranks = SampleDigest().ranks})}) {
    for (size_t n = 0; n < bytes.size(); ++n) {
      absl::StatusOr<Frame> frame = DecodeFrame(bytes.substr(0, n));
      ASSERT_FALSE(frame.ok()) << n;
      EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss) << n;
    }
    absl::StatusOr<Frame> trailing = DecodeFrame(bytes + "x");
    EXPECT_EQ(trailing.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(trailing.status().message().find("trailing"), std::string::npos);
  }
}

TEST(DigestWireTest, HostileCountsAndFieldsAreRefusedNamingTheField) {
  // A rank count far past the bytes present: refused before allocating.
  std::string bytes = EncodeFrame(1, 1, Digest{});
  std::memset(&bytes[kFrameHeaderBytes + 8], 0xff, 4);
  absl::StatusOr<Frame> frame = DecodeFrame(bytes);
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(frame.status().message().find("digest rank count"),
            std::string::npos)
      << frame.status();
  // More ranks than any group has, every byte present: refused too.
  Digest huge;
  huge.ranks.resize(kMaxDigestRanks + 1);
  frame = DecodeFrame(EncodeFrame(1, 1, huge));
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(frame.status().message().find("is over 4096"), std::string::npos)
      << frame.status();
  huge.ranks.resize(kMaxDigestRanks);
  EXPECT_TRUE(DecodeFrame(EncodeFrame(1, 1, huge)).ok());
  // A match byte other than 0 or 1.
  std::string result = EncodeFrame(1, 1, DigestResult{.match = true});
  result[kFrameHeaderBytes + 8] = 2;
  frame = DecodeFrame(result);
  EXPECT_EQ(frame.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(frame.status().message().find("digest_result match"),
            std::string::npos)
      << frame.status();
  // A kind past the last one.
  std::string unknown = EncodeFrame(1, 1, Digest{});
  unknown[1] = 11;
  EXPECT_EQ(DecodeFrame(unknown).status().code(), absl::StatusCode::kDataLoss);
}

TEST(DigestWireTest, EverySingleByteCorruptionIsCanonicalOrRefused) {
  const std::string bytes =
      EncodeFrame(4, 10, DigestResult{.tasks_frames = 3,
                                      .match = false,
                                      .ranks = SampleDigest().ranks});
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      absl::StatusOr<Frame> frame = DecodeFrame(bad);
      if (frame.ok()) {
        EXPECT_EQ(EncodeFrame(*frame), bad) << i << "/" << bit;
      } else {
        EXPECT_TRUE(frame.status().code() == absl::StatusCode::kDataLoss ||
                    frame.status().code() ==
                        absl::StatusCode::kInvalidArgument)
            << frame.status();
      }
    }
  }
}

}  // namespace
}  // namespace hicache::group
