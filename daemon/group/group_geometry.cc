#include "daemon/group/group_geometry.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/comm/communicator.h"
#include "daemon/core/daemon_config.h"
#include "daemon/core/le_bytes.h"
#include "daemon/group/group_wire.h"
#include "version/version.h"

namespace hicache::group {
namespace {

// LeReader, with errors that name the field.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}

  absl::Status U8(const char* field, uint8_t* v) {
    return in_.U8(v) ? absl::OkStatus() : Truncated(field, 1);
  }
  absl::Status U32(const char* field, uint32_t* v) {
    return in_.U32(v) ? absl::OkStatus() : Truncated(field, 4);
  }
  absl::Status U64(const char* field, uint64_t* v) {
    return in_.U64(v) ? absl::OkStatus() : Truncated(field, 8);
  }
  absl::Status Str(const char* field, std::string* v) {
    uint32_t length = 0;
    if (auto s = U32(field, &length); !s.ok()) return s;
    if (length > kMaxGeometryStringBytes) {
      return absl::DataLossError(
          absl::StrCat("CP group geometry: ", field, " of ", length,
                       " bytes (at most ", kMaxGeometryStringBytes, ")"));
    }
    absl::string_view bytes;
    if (!in_.Bytes(length, &bytes)) return Truncated(field, length);
    v->assign(bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  // `n` u32 ranks (their count already read and bounded).
  absl::Status Ranks(uint32_t n, std::vector<Rank>* ranks) {
    if (in_.Values(n, ranks)) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(
        "CP group geometry truncated in ranks: ", n, " ranks need ",
        uint64_t{n} * 4, " bytes, ", remaining(), " left"));
  }
  size_t remaining() const { return in_.remaining(); }

 private:
  absl::Status Truncated(const char* field, size_t bytes) const {
    return absl::DataLossError(
        absl::StrCat("CP group geometry truncated in ", field, ": ", bytes,
                     " bytes needed, ", remaining(), " left"));
  }
  LeReader in_;
};

std::string Quoted(absl::string_view s) {
  return absl::StrCat("\"", absl::CHexEscape(s), "\"");
}

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

std::string RankRange(Rank first, Rank last) {
  return first == last ? absl::StrCat("rank ", first)
                       : absl::StrCat("ranks ", first, "-", last);
}

std::string RanksText(const std::vector<Rank>& ranks) {
  if (ranks.empty()) return "none";
  const bool consecutive =
      std::adjacent_find(ranks.begin(), ranks.end(), [](Rank a, Rank b) {
        return b != a + 1;
      }) == ranks.end();
  if (consecutive) {
    return ranks.size() == 1 ? absl::StrCat(ranks.front())
                             : absl::StrCat(ranks.front(), "-", ranks.back());
  }
  return absl::StrJoin(ranks, ",");
}

}  // namespace

std::string RangesText(const std::vector<Rank>& ranks) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(RankRange(ranks[i], ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

uint64_t KvFamiliesFingerprint(const KvGeometry& kv) {
  std::string bytes;
  LeWriter w(&bytes);
  w.String("hicache-kv-families-v1");
  w.U64(kv.page_size());
  w.U64(kv.families().size());
  for (const KvFamily& f : kv.families()) {
    w.String(f.name);
    w.U64(f.bytes_per_token);
    w.U64(f.num_layers);
    w.U8(f.draft ? 1 : 0);
  }
  return XXH3_64bits(bytes.data(), bytes.size());
}

GroupGeometry GroupGeometryFrom(const EngineOptions& options,
                                const KvGeometry& kv) {
  return GroupGeometryFrom(options, kv, VersionString());
}

GroupGeometry GroupGeometryFrom(const EngineOptions& options,
                                const KvGeometry& kv, std::string build) {
  GroupGeometry g;
  g.page_size = options.page_size;
  g.cp_size = options.cp_size;
  g.kv_preset = options.kv_preset;
  g.kv_fingerprint = KvFamiliesFingerprint(kv);
  g.bytes_per_page = kv.BytesPerPage();
  g.num_steps = kv.NumSteps();
  g.host_layout = std::string(HostLayoutName(options.host_layout));
  g.device_pages_per_rank =
      static_cast<uint64_t>(options.device_pages_per_rank);
  g.host_pages_per_rank = static_cast<uint64_t>(options.host_pages_per_rank);
  g.wire_version = kWireVersion;
  g.max_frame_bytes = comm::kMaxFrameBytes;
  g.build = std::move(build);
  if (!options.pool_ranks.empty()) {
    g.ranks = options.pool_ranks;
  } else if (!options.served_ranks.empty()) {
    g.ranks = options.served_ranks;
  } else {
    for (Rank r = 0; r < options.cp_size; ++r) g.ranks.push_back(r);
  }
  return g;
}

absl::Status CheckGeometry(const GroupGeometry& leader,
                           const GroupGeometry& member,
                           absl::string_view member_name) {
  std::vector<std::string> diffs;
  const std::string name = absl::CHexEscape(member_name);
  auto differ = [&](const char* field, const std::string& ours,
                    const std::string& theirs) {
    diffs.push_back(absl::StrCat(field, ": leader ", ours, ", follower ", name,
                                 " ", theirs));
  };
  auto num = [&](const char* field, uint64_t ours, uint64_t theirs) {
    if (ours != theirs) differ(field, absl::StrCat(ours), absl::StrCat(theirs));
  };
  auto str = [&](const char* field, const std::string& ours,
                 const std::string& theirs) {
    if (ours != theirs) differ(field, Quoted(ours), Quoted(theirs));
  };
  num("page_size", leader.page_size, member.page_size);
  num("cp_size", leader.cp_size, member.cp_size);
  str("kv_preset", leader.kv_preset, member.kv_preset);
  if (leader.kv_fingerprint != member.kv_fingerprint) {
    differ("kv_fingerprint", Hex(leader.kv_fingerprint),
           Hex(member.kv_fingerprint));
  }
  num("bytes_per_page", leader.bytes_per_page, member.bytes_per_page);
  num("num_steps", leader.num_steps, member.num_steps);
  str("host_layout", leader.host_layout, member.host_layout);
  num("device_pages_per_rank", leader.device_pages_per_rank,
      member.device_pages_per_rank);
  num("host_pages_per_rank", leader.host_pages_per_rank,
      member.host_pages_per_rank);
  num("wire_version", leader.wire_version, member.wire_version);
  num("max_frame_bytes", leader.max_frame_bytes, member.max_frame_bytes);
  str("build", leader.build, member.build);
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("CP group geometry of follower ", name,
                   " differs from the leader's: ", absl::StrJoin(diffs, "; ")));
}

absl::Status CheckRankAssignment(uint32_t cp_size,
                                 absl::Span<const MemberRanks> members,
                                 RankCoverage coverage) {
  if (cp_size == 0 || cp_size > DaemonConfig::kMaxCpSize) {
    return absl::FailedPreconditionError(
        absl::StrCat("CP group rank assignment: CP size ", cp_size,
                     " out of range [1, ", DaemonConfig::kMaxCpSize, "]"));
  }
  std::vector<std::string> problems;
  // Owners of each rank in range, by member index.
  std::vector<std::vector<size_t>> owners(cp_size);
  for (size_t m = 0; m < members.size(); ++m) {
    const MemberRanks& member = members[m];
    const std::string name = absl::CHexEscape(member.name);
    if (member.ranks.empty()) {
      problems.push_back(absl::StrCat("member ", name, " serves no rank"));
      continue;
    }
    for (size_t i = 1; i < member.ranks.size(); ++i) {
      if (member.ranks[i] != member.ranks[i - 1] + 1) {
        problems.push_back(absl::StrCat(
            "member ", name, " ranks ", RanksText(member.ranks),
            " are not contiguous (ascending, each one more than the last)"));
        break;
      }
    }
    std::vector<Rank> out_of_range;
    for (Rank r : member.ranks) {
      if (r >= cp_size) {
        out_of_range.push_back(r);
      } else if (std::find(owners[r].begin(), owners[r].end(), m) ==
                 owners[r].end()) {
        owners[r].push_back(m);
      }
    }
    if (!out_of_range.empty()) {
      std::sort(out_of_range.begin(), out_of_range.end());
      out_of_range.erase(std::unique(out_of_range.begin(), out_of_range.end()),
                         out_of_range.end());
      problems.push_back(absl::StrCat("member ", name, " ",
                                      RangesText(out_of_range),
                                      " out of range [0, ", cp_size, ")"));
    }
  }
  std::vector<Rank> missing;
  for (Rank r = 0; r < cp_size; ++r) {
    if (owners[r].empty()) {
      missing.push_back(r);
    } else if (owners[r].size() > 1) {
      std::vector<std::string> names;
      for (size_t m : owners[r]) {
        names.push_back(absl::CHexEscape(members[m].name));
      }
      problems.push_back(absl::StrCat(
          "rank ", r, " served by ",
          owners[r].size() == 2 ? "both " : "each of ",
          absl::StrJoin(names, owners[r].size() == 2 ? " and " : ", ")));
    }
  }
  if (!missing.empty() && coverage == RankCoverage::kComplete) {
    problems.push_back(
        absl::StrCat(RangesText(missing), " served by no member"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("CP group rank assignment (C=", cp_size,
                   ") refused: ", absl::StrJoin(problems, "; ")));
}

std::string EncodeGroupGeometry(const GroupGeometry& g) {
  std::string bytes;
  LeWriter w(&bytes);
  w.U8(kGroupGeometryFormat);
  w.U32(g.page_size);
  w.U32(g.cp_size);
  w.String(g.kv_preset);
  w.U64(g.kv_fingerprint);
  w.U64(g.bytes_per_page);
  w.U32(g.num_steps);
  w.String(g.host_layout);
  w.U64(g.device_pages_per_rank);
  w.U64(g.host_pages_per_rank);
  w.U8(g.wire_version);
  w.U64(g.max_frame_bytes);
  w.String(g.build);
  w.Array(g.ranks);
  return bytes;
}

absl::StatusOr<GroupGeometry> DecodeGroupGeometry(absl::string_view bytes) {
  Reader r(bytes);
  GroupGeometry g;
  uint8_t format = 0;
  if (auto s = r.U8("format", &format); !s.ok()) return s;
  if (format != kGroupGeometryFormat) {
    return absl::DataLossError(
        absl::StrCat("CP group geometry: unknown format ", int{format},
                     " (this build reads ", int{kGroupGeometryFormat}, ")"));
  }
  absl::Status s;
  if (!(s = r.U32("page_size", &g.page_size)).ok() ||
      !(s = r.U32("cp_size", &g.cp_size)).ok() ||
      !(s = r.Str("kv_preset", &g.kv_preset)).ok() ||
      !(s = r.U64("kv_fingerprint", &g.kv_fingerprint)).ok() ||
      !(s = r.U64("bytes_per_page", &g.bytes_per_page)).ok() ||
      !(s = r.U32("num_steps", &g.num_steps)).ok() ||
      !(s = r.Str("host_layout", &g.host_layout)).ok() ||
      !(s = r.U64("device_pages_per_rank", &g.device_pages_per_rank)).ok() ||
      !(s = r.U64("host_pages_per_rank", &g.host_pages_per_rank)).ok() ||
      !(s = r.U8("wire_version", &g.wire_version)).ok() ||
      !(s = r.U64("max_frame_bytes", &g.max_frame_bytes)).ok() ||
      !(s = r.Str("build", &g.build)).ok()) {
    return s;
  }
  uint32_t n = 0;
  if (!(s = r.U32("rank count", &n)).ok()) return s;
  if (n > kMaxGeometryRanks) {
    return absl::DataLossError(absl::StrCat(
        "CP group geometry: ", n, " ranks (at most ", kMaxGeometryRanks, ")"));
  }
  if (!(s = r.Ranks(n, &g.ranks)).ok()) return s;
  if (r.remaining() != 0) {
    return absl::DataLossError(
        absl::StrCat("CP group geometry: ", r.remaining(), " trailing bytes"));
  }
  return g;
}

std::string DescribeGroupGeometry(const GroupGeometry& g) {
  return absl::StrCat(
      "P=", g.page_size, " C=", g.cp_size, " kv=", Quoted(g.kv_preset), " (fp ",
      Hex(g.kv_fingerprint), ", ", g.bytes_per_page, " B/page, ", g.num_steps,
      " steps) ", Quoted(g.host_layout), " device=", g.device_pages_per_rank,
      " host=", g.host_pages_per_rank, " wire=", int{g.wire_version},
      " frame=", g.max_frame_bytes, " build=", Quoted(g.build),
      " ranks=", RanksText(g.ranks));
}

}  // namespace hicache::group
