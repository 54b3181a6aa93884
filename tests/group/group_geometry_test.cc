#include "daemon/group/group_geometry.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "daemon/comm/communicator.h"
#include "daemon/engine/engine_options.h"
#include "daemon/group/group_wire.h"
#include "daemon/pool/kv_geometry.h"
#include "gtest/gtest.h"

namespace hicache::group {
namespace {

constexpr absl::string_view kFollower = "10.0.0.2:7070";

EngineOptions Options(uint32_t cp_size, std::vector<Rank> pool_ranks) {
  EngineOptions o;
  o.page_size = 64;
  o.cp_size = cp_size;
  o.kv_preset = "tiny";
  o.device_pages_per_rank = 1024;
  o.host_pages_per_rank = 4096;
  o.host_layout = HostLayout::kLayerFirst;
  o.pool_ranks = std::move(pool_ranks);
  return o;
}

KvGeometry Kv(absl::string_view preset = "tiny", uint32_t page_size = 64) {
  absl::StatusOr<KvGeometry> kv = KvGeometry::Preset(preset, page_size);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return *kv;
}

GroupGeometry Base() {
  return GroupGeometryFrom(Options(4, {0, 1}), Kv(), "0.2.0 (abc)");
}

TEST(GroupGeometryFrom, TakesEveryFieldFromTheOptionsAndGeometry) {
  const KvGeometry kv = Kv("tiny-draft");
  EngineOptions o = Options(4, {2, 3});
  o.kv_preset = "tiny-draft";
  o.host_layout = HostLayout::kPageFirst;
  const GroupGeometry g = GroupGeometryFrom(o, kv, "b");
  EXPECT_EQ(g.page_size, 64u);
  EXPECT_EQ(g.cp_size, 4u);
  EXPECT_EQ(g.kv_preset, "tiny-draft");
  EXPECT_EQ(g.kv_fingerprint, KvFamiliesFingerprint(kv));
  EXPECT_EQ(g.bytes_per_page, kv.BytesPerPage());
  EXPECT_EQ(g.num_steps, kv.NumSteps());
  EXPECT_EQ(g.host_layout, "page_first");
  EXPECT_EQ(g.device_pages_per_rank, 1024u);
  EXPECT_EQ(g.host_pages_per_rank, 4096u);
  EXPECT_EQ(g.wire_version, kWireVersion);
  EXPECT_EQ(g.max_frame_bytes, comm::kMaxFrameBytes);
  EXPECT_EQ(g.build, "b");
  EXPECT_EQ(g.ranks, (std::vector<Rank>{2, 3}));
  // The default build is this binary's version string.
  EXPECT_FALSE(GroupGeometryFrom(o, kv).build.empty());
}

TEST(GroupGeometryFrom, RanksArePoolRanksElseServedElseAll) {
  EngineOptions o = Options(4, {});
  EXPECT_EQ(GroupGeometryFrom(o, Kv(), "b").ranks,
            (std::vector<Rank>{0, 1, 2, 3}));
  o.served_ranks = {1, 2};
  EXPECT_EQ(GroupGeometryFrom(o, Kv(), "b").ranks, (std::vector<Rank>{1, 2}));
  o.served_ranks = {0, 1, 2, 3};
  o.pool_ranks = {0};
  EXPECT_EQ(GroupGeometryFrom(o, Kv(), "b").ranks, (std::vector<Rank>{0}));
}

TEST(KvFamiliesFingerprint, FamiliesDefineItNotTheName) {
  const KvGeometry tiny = Kv("tiny");
  EXPECT_EQ(KvFamiliesFingerprint(tiny), KvFamiliesFingerprint(Kv("tiny")));
  EXPECT_NE(KvFamiliesFingerprint(tiny), KvFamiliesFingerprint(Kv("micro")));
  EXPECT_NE(KvFamiliesFingerprint(tiny),
            KvFamiliesFingerprint(Kv("tiny-draft")));
  EXPECT_NE(KvFamiliesFingerprint(tiny), KvFamiliesFingerprint(Kv("tiny", 32)));
  absl::StatusOr<KvGeometry> renamed =
      KvGeometry::Create(64, tiny.families(), "another name");
  ASSERT_TRUE(renamed.ok());
  EXPECT_EQ(KvFamiliesFingerprint(*renamed), KvFamiliesFingerprint(tiny));
  std::vector<KvFamily> families = tiny.families();
  families[0].draft = !families[0].draft;
  absl::StatusOr<KvGeometry> drafted = KvGeometry::Create(64, families);
  ASSERT_TRUE(drafted.ok());
  EXPECT_NE(KvFamiliesFingerprint(*drafted), KvFamiliesFingerprint(tiny));
}

TEST(CheckGeometry, EqualGeometriesAgreeWhateverTheirRanks) {
  GroupGeometry member = Base();
  member.ranks = {2, 3};
  EXPECT_TRUE(CheckGeometry(Base(), member, kFollower).ok());
}

struct FieldCase {
  const char* field;
  std::function<void(GroupGeometry&)> change;
  const char* leader_value;
  const char* member_value;
};

std::vector<FieldCase> FieldCases() {
  return {
      {"page_size", [](GroupGeometry& g) { g.page_size = 32; }, "64", "32"},
      {"cp_size", [](GroupGeometry& g) { g.cp_size = 8; }, "4", "8"},
      {"kv_preset", [](GroupGeometry& g) { g.kv_preset = "micro"; },
       "\"tiny\"", "\"micro\""},
      {"kv_fingerprint", [](GroupGeometry& g) { g.kv_fingerprint ^= 1; },
       nullptr, nullptr},
      {"bytes_per_page", [](GroupGeometry& g) { g.bytes_per_page = 7; },
       nullptr, "7"},
      {"num_steps", [](GroupGeometry& g) { g.num_steps = 9; }, "2", "9"},
      {"host_layout", [](GroupGeometry& g) { g.host_layout = "page_first"; },
       "\"layer_first\"", "\"page_first\""},
      {"device_pages_per_rank",
       [](GroupGeometry& g) { g.device_pages_per_rank = 512; }, "1024", "512"},
      {"host_pages_per_rank",
       [](GroupGeometry& g) { g.host_pages_per_rank = 1; }, "4096", "1"},
      {"wire_version", [](GroupGeometry& g) { g.wire_version = 2; }, "1",
       "2"},
      {"max_frame_bytes", [](GroupGeometry& g) { g.max_frame_bytes = 65536; },
       nullptr, "65536"},
      {"build", [](GroupGeometry& g) { g.build = "0.3.0 (def)"; },
       "\"0.2.0 (abc)\"", "\"0.3.0 (def)\""},
  };
}

TEST(CheckGeometry, EveryDifferingFieldIsNamedWithBothValues) {
  for (const FieldCase& c : FieldCases()) {
    SCOPED_TRACE(c.field);
    GroupGeometry member = Base();
    c.change(member);
    const absl::Status s = CheckGeometry(Base(), member, kFollower);
    ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    const std::string m(s.message());
    EXPECT_TRUE(absl::StrContains(m, std::string(c.field) + ": leader ")) << m;
    EXPECT_TRUE(absl::StrContains(m, kFollower)) << m;
    if (c.leader_value != nullptr && c.member_value != nullptr) {
      EXPECT_TRUE(absl::StrContains(
          m, absl::StrCat(c.field, ": leader ", c.leader_value, ", follower ",
                          kFollower, " ", c.member_value)))
          << m;
    }
    // Only that field.
    for (const FieldCase& other : FieldCases()) {
      if (std::string(other.field) == c.field) continue;
      EXPECT_FALSE(absl::StrContains(m, std::string(other.field) + ":"))
          << other.field << " in " << m;
    }
  }
}

TEST(CheckGeometry, SeveralMismatchesAreAllNamedInOrder) {
  GroupGeometry member = Base();
  for (const FieldCase& c : FieldCases()) c.change(member);
  const absl::Status s = CheckGeometry(Base(), member, kFollower);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(s.message());
  size_t last = 0;
  for (const FieldCase& c : FieldCases()) {
    const size_t at = m.find(std::string(c.field) + ": leader ");
    ASSERT_NE(at, std::string::npos) << c.field << " missing in " << m;
    EXPECT_GE(at, last) << c.field << " out of order in " << m;
    last = at;
  }
  EXPECT_TRUE(absl::StrContains(
      m, "page_size: leader 64, follower 10.0.0.2:7070 32; cp_size: leader 4"))
      << m;
}

TEST(CheckGeometry, HostileStringsAreEscaped) {
  GroupGeometry member = Base();
  member.kv_preset = std::string("ti\nny\0\x7f", 7);
  const absl::Status s = CheckGeometry(Base(), member, "x");
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(absl::StrContains(s.message(), "\n")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "\"ti\\nny\\x00\\x7f\"")) << s;
}

TEST(CheckGeometry, RealGeometriesThatDiffer) {
  const GroupGeometry leader = Base();
  EngineOptions o = Options(4, {2, 3});
  o.page_size = 32;
  o.host_layout = HostLayout::kPageFirst;
  const GroupGeometry member = GroupGeometryFrom(o, Kv("tiny", 32), "0.2.0 (abc)");
  const absl::Status s = CheckGeometry(leader, member, kFollower);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  for (const char* field : {"page_size", "kv_fingerprint", "bytes_per_page",
                            "host_layout"}) {
    EXPECT_TRUE(absl::StrContains(s.message(), field)) << field << ": " << s;
  }
  EXPECT_FALSE(absl::StrContains(s.message(), "kv_preset")) << s;
}

// Rank assignment.

absl::Status Assign(uint32_t cp_size, std::vector<MemberRanks> members) {
  return CheckRankAssignment(cp_size, members);
}

TEST(CheckRankAssignment, PartitionsAreAccepted) {
  EXPECT_TRUE(Assign(4, {{"a", {0, 1}}, {"b", {2, 3}}}).ok());
  EXPECT_TRUE(Assign(4, {{"a", {0}}, {"b", {1, 2, 3}}}).ok());
  EXPECT_TRUE(Assign(8, {{"a", {0, 1, 2, 3}}, {"b", {4, 5, 6, 7}}}).ok());
  // Members in any order, one member alone, one rank each.
  EXPECT_TRUE(Assign(8, {{"b", {4, 5, 6, 7}}, {"a", {0, 1, 2, 3}}}).ok());
  EXPECT_TRUE(Assign(1, {{"a", {0}}}).ok());
  EXPECT_TRUE(
      Assign(4, {{"a", {0}}, {"b", {1}}, {"c", {2}}, {"d", {3}}}).ok());
}

void ExpectRefused(const absl::Status& s,
                   std::vector<std::string> fragments) {
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (const std::string& f : fragments) {
    EXPECT_TRUE(absl::StrContains(s.message(), f))
        << "\"" << f << "\" not in: " << s.message();
  }
}

TEST(CheckRankAssignment, OverlapNamesBothMembers) {
  ExpectRefused(Assign(4, {{"a", {0, 1, 2}}, {"b", {2, 3}}}),
                {"rank 2 served by both a and b"});
  ExpectRefused(Assign(4, {{"a", {0, 1}}, {"b", {1, 2}}, {"c", {1, 2, 3}}}),
                {"rank 1 served by each of a, b, c", "rank 2 served by both b and c"});
  // The same member twice.
  ExpectRefused(Assign(2, {{"a", {0, 1}}, {"a", {0, 1}}}),
                {"rank 0 served by both a and a"});
}

TEST(CheckRankAssignment, GapsNameTheMissingRanks) {
  ExpectRefused(Assign(8, {{"a", {0, 1}}, {"b", {5, 6}}}),
                {"ranks 2-4, rank 7 served by no member"});
  ExpectRefused(Assign(4, {}), {"ranks 0-3 served by no member"});
}

TEST(CheckRankAssignment, NonContiguousOrUnsortedRanksAreRefused) {
  ExpectRefused(Assign(4, {{"a", {0, 2}}, {"b", {1, 3}}}),
                {"member a ranks 0,2 are not contiguous",
                 "member b ranks 1,3 are not contiguous"});
  ExpectRefused(Assign(2, {{"a", {1, 0}}}), {"member a ranks 1,0"});
  // A repeated rank within one member.
  ExpectRefused(Assign(2, {{"a", {0, 0, 1}}}), {"member a ranks 0,0,1"});
}

TEST(CheckRankAssignment, EmptyMembersAndOutOfRangeRanksAreRefused) {
  ExpectRefused(Assign(4, {{"a", {0, 1, 2, 3}}, {"b", {}}}),
                {"member b serves no rank"});
  ExpectRefused(Assign(4, {{"a", {0, 1}}, {"b", {2, 3, 4, 5}}}),
                {"member b ranks 4-5 out of range [0, 4)"});
  ExpectRefused(Assign(4, {{"a", {0, 1, 2, 3}}, {"b", {0xffffffffu}}}),
                {"member b rank 4294967295 out of range"});
  ExpectRefused(Assign(0, {{"a", {0}}}), {"CP size 0"});
  ExpectRefused(Assign(1u << 30, {{"a", {0}}}), {"CP size 1073741824"});
}

TEST(CheckRankAssignment, PartialCoverageAllowsGapsButNothingElse) {
  // Members still joining: gaps are fine, the rest is not.
  EXPECT_TRUE(CheckRankAssignment(8, {}, RankCoverage::kPartial).ok());
  EXPECT_TRUE(CheckRankAssignment(8, {{"b", {4, 5, 6, 7}}},
                                  RankCoverage::kPartial)
                  .ok());
  EXPECT_TRUE(CheckRankAssignment(8, {{"a", {0}}, {"b", {6, 7}}},
                                  RankCoverage::kPartial)
                  .ok());
  const absl::Status s = CheckRankAssignment(
      8, {{"a", {0, 1, 2}}, {"b", {2, 3}}, {"c", {}}, {"d", {5, 7}},
          {"e", {8}}},
      RankCoverage::kPartial);
  ExpectRefused(s, {"rank 2 served by both a and b", "member c serves no rank",
                    "member d ranks 5,7", "member e rank 8 out of range"});
  EXPECT_FALSE(absl::StrContains(s.message(), "served by no member")) << s;
  ExpectRefused(CheckRankAssignment(0, {}, RankCoverage::kPartial),
                {"CP size 0"});
}

TEST(CheckRankAssignment, NamesAreEscaped) {
  const absl::Status s =
      Assign(2, {{"a\nb\x01", {0, 1}}, {std::string("evil\n\0", 7), {1}}});
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(absl::StrContains(s.message(), "\n")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "both a\\nb\\x01 and evil\\n\\x00"))
      << s;
  const absl::Status g =
      CheckGeometry(Base(), GroupGeometry{}, std::string("x\ny", 3));
  ASSERT_FALSE(g.ok());
  EXPECT_FALSE(absl::StrContains(g.message(), "\n")) << g;
  EXPECT_TRUE(absl::StrContains(g.message(), "follower x\\ny ")) << g;
}

TEST(CheckRankAssignment, EveryProblemIsNamedAtOnce) {
  ExpectRefused(Assign(8, {{"a", {0, 1}}, {"b", {}}, {"c", {1, 3}},
                           {"d", {9}}}),
                {"member b serves no rank", "member c ranks 1,3",
                 "rank 1 served by both a and c", "member d rank 9 out of range",
                 "rank 2, ranks 4-7 served by no member"});
}

// Encoding.

TEST(GroupGeometryEncoding, RoundTripsAndIsCanonical) {
  std::vector<GroupGeometry> samples = {Base(), GroupGeometry{}};
  GroupGeometry extreme = Base();
  extreme.page_size = 0xffffffffu;
  extreme.kv_fingerprint = ~uint64_t{0};
  extreme.device_pages_per_rank = ~uint64_t{0};
  extreme.wire_version = 255;
  extreme.kv_preset = std::string("\0\xff", 2);
  extreme.build = std::string(kMaxGeometryStringBytes, 'b');
  extreme.ranks.assign(kMaxGeometryRanks, 7);
  samples.push_back(extreme);
  for (const GroupGeometry& g : samples) {
    const std::string bytes = EncodeGroupGeometry(g);
    absl::StatusOr<GroupGeometry> decoded = DecodeGroupGeometry(bytes);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, g);
    EXPECT_EQ(EncodeGroupGeometry(*decoded), bytes);
  }
  EXPECT_EQ(EncodeGroupGeometry(Base())[0], char{kGroupGeometryFormat});
}

TEST(GroupGeometryEncoding, EveryTruncationIsDataLoss) {
  const std::string bytes = EncodeGroupGeometry(Base());
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<GroupGeometry> d = DecodeGroupGeometry(bytes.substr(0, n));
    ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << n;
    EXPECT_TRUE(absl::StrContains(d.status().message(), "truncated")) << n;
  }
}

TEST(GroupGeometryEncoding, TrailingBytesAndUnknownFormatAreDataLoss) {
  std::string bytes = EncodeGroupGeometry(Base()) + "x";
  absl::StatusOr<GroupGeometry> d = DecodeGroupGeometry(bytes);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(d.status().message(), "1 trailing bytes"));
  bytes = EncodeGroupGeometry(Base());
  bytes[0] = 2;
  d = DecodeGroupGeometry(bytes);
  ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(d.status().message(), "unknown format 2"));
}

// Offsets of the length and count fields in the encoding of `g`.
struct LengthField {
  const char* name;
  size_t offset;
};

std::vector<LengthField> LengthFields(const GroupGeometry& g) {
  const size_t preset = 1 + 4 + 4;
  const size_t layout = preset + 4 + g.kv_preset.size() + 8 + 8 + 4;
  const size_t build = layout + 4 + g.host_layout.size() + 8 + 8 + 1 + 8;
  const size_t ranks = build + 4 + g.build.size();
  return {{"kv_preset", preset},
          {"host_layout", layout},
          {"build", build},
          {"rank", ranks}};
}

void PutU32(std::string* bytes, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*bytes)[at + i] = static_cast<char>(v >> (8 * i));
}

TEST(GroupGeometryEncoding, HostileLengthsAreDataLossNamingTheField) {
  const GroupGeometry g = Base();
  const std::string good = EncodeGroupGeometry(g);
  for (const LengthField& f : LengthFields(g)) {
    // The field sits where we think it does.
    uint32_t current = 0;
    for (int i = 0; i < 4; ++i) {
      current |= uint32_t{static_cast<uint8_t>(good[f.offset + i])} << (8 * i);
    }
    ASSERT_EQ(current, std::string(f.name) == "rank"
                           ? g.ranks.size()
                           : std::string(f.name) == "kv_preset"
                                 ? g.kv_preset.size()
                                 : std::string(f.name) == "host_layout"
                                       ? g.host_layout.size()
                                       : g.build.size())
        << f.name;
    for (uint32_t hostile : {0xffffffffu, 0x80000000u, 0x10000u,
                             static_cast<uint32_t>(kMaxGeometryRanks + 1),
                             static_cast<uint32_t>(kMaxGeometryStringBytes + 1),
                             current + 1,
                             static_cast<uint32_t>(good.size())}) {
      SCOPED_TRACE(absl::StrCat(f.name, " = ", hostile));
      std::string bytes = good;
      PutU32(&bytes, f.offset, hostile);
      absl::StatusOr<GroupGeometry> d = DecodeGroupGeometry(bytes);
      // A length past the end is caught at its own field; one that still
      // fits swallows the fields after it, and the decode fails there.
      const size_t element = std::string(f.name) == "rank" ? 4 : 1;
      const size_t left = good.size() - f.offset - 4;
      if (uint64_t{hostile} * element > left) {
        ASSERT_EQ(d.status().code(), absl::StatusCode::kDataLoss)
            << d.status();
        EXPECT_TRUE(absl::StrContains(d.status().message(), f.name))
            << d.status();
      } else if (d.ok()) {
        EXPECT_EQ(EncodeGroupGeometry(*d), bytes);
      } else {
        EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss)
            << d.status();
      }
    }
    // A shorter length leaves bytes that do not parse as what follows, or
    // trailing bytes: never OK with a different value silently accepted
    // unless it re-encodes to the same bytes.
    if (current > 0) {
      std::string bytes = good;
      PutU32(&bytes, f.offset, current - 1);
      absl::StatusOr<GroupGeometry> d = DecodeGroupGeometry(bytes);
      if (d.ok()) {
        EXPECT_EQ(EncodeGroupGeometry(*d), bytes);
      } else {
        EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
      }
    }
  }
}

TEST(GroupGeometryEncoding, EverySingleByteCorruptionDecodesCanonicallyOrFails) {
  const std::string good = EncodeGroupGeometry(Base());
  for (size_t i = 0; i < good.size(); ++i) {
    for (int delta : {1, 0x80, 0xff}) {
      std::string bytes = good;
      bytes[i] = static_cast<char>(static_cast<uint8_t>(bytes[i]) + delta);
      absl::StatusOr<GroupGeometry> d = DecodeGroupGeometry(bytes);
      if (d.ok()) {
        EXPECT_EQ(EncodeGroupGeometry(*d), bytes) << i;
      } else {
        EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << i;
      }
    }
  }
}

// The bytes of an encoding and the fingerprint, pinned: computed with the
// hand-written encoder that preceded le_bytes, so a codec change that moves
// a byte fails here.
TEST(GroupGeometryEncoding, BytesArePinned) {
  GroupGeometry g;
  g.page_size = 64;
  g.cp_size = 4;
  g.kv_preset = "tiny";
  g.kv_fingerprint = 0x0102030405060708ull;
  g.bytes_per_page = 4096;
  g.num_steps = 3;
  g.host_layout = "layer_first";
  g.device_pages_per_rank = 100;
  g.host_pages_per_rank = 200;
  g.wire_version = 2;
  g.max_frame_bytes = 1 << 20;
  g.build = "b";
  g.ranks = {1, 2};
  EXPECT_EQ(absl::BytesToHexString(EncodeGroupGeometry(g)),
            "0140000000040000000400000074696e79080706050403020100100000000000"
            "00030000000b0000006c617965725f66697273746400000000000000c8000000"
            "000000000200001000000000000100000062020000000100000002000000");
  EXPECT_EQ(KvFamiliesFingerprint(Kv("deepseek-v3.2-fp8", 64)),
            uint64_t{0xdca40ae86019d2d8});
}

TEST(DescribeGroupGeometry, NamesTheMainFields) {
  const std::string d = DescribeGroupGeometry(Base());
  EXPECT_TRUE(absl::StrContains(d, "P=64 C=4")) << d;
  EXPECT_TRUE(absl::StrContains(d, "\"tiny\"")) << d;
  EXPECT_TRUE(absl::StrContains(d, "ranks=0-1")) << d;
}

}  // namespace
}  // namespace hicache::group
