#pragma once

// What the daemons of one CP group must agree on before the group forms
// (docs/cp-groups.md, "Handshake and health"), and the checks a leader runs
// on a joining member:
//
//  * GroupGeometry: everything that gives a copy list its meaning on both
//    ends -- page size, CP size, KV preset and a fingerprint of its byte
//    geometry, bytes per page, steps, host layout, pool sizes -- plus the
//    link's wire version and frame bound and the build. Built from a
//    daemon's EngineOptions and KvGeometry (GroupGeometryFrom); travels in a
//    Join message as bytes (EncodeGroupGeometry / DecodeGroupGeometry).
//  * CheckGeometry: the leader's geometry against a member's; every
//    differing field is named with both values.
//  * CheckRankAssignment: the members' ranks cover [0, C) exactly once,
//    each member a non-empty contiguous run.
//
// Encoding (little-endian, no padding; Str = u32 length + bytes):
//
//   u8  format          kGroupGeometryFormat (1)
//   u32 page_size, u32 cp_size, Str kv_preset, u64 kv_fingerprint,
//   u64 bytes_per_page, u32 num_steps, Str host_layout,
//   u64 device_pages_per_rank, u64 host_pages_per_rank,
//   u8  wire_version, u64 max_frame_bytes, Str build,
//   u32 n, then n u32 ranks
//
// Decoding takes untrusted bytes: every length and count is checked against
// the bytes that remain and against its bound (kMaxGeometryStringBytes,
// kMaxGeometryRanks) before anything is allocated; the input must be
// consumed exactly; anything else (unknown format, truncation, trailing
// bytes) is DATA_LOSS naming the field. Decoding is canonical: whatever
// decodes re-encodes to the same bytes. Decoding checks shape only; meaning
// (a rank out of range, a page size that differs) is for the checks.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/engine/engine_options.h"
#include "daemon/layout/cp_layout.h"
#include "daemon/pool/kv_geometry.h"

namespace hicache::group {

inline constexpr uint8_t kGroupGeometryFormat = 1;
inline constexpr size_t kMaxGeometryStringBytes = 1024;
inline constexpr size_t kMaxGeometryRanks = 4096;

struct GroupGeometry {
  // Compared by CheckGeometry (all must be equal).
  uint32_t page_size = 0;
  uint32_t cp_size = 0;
  std::string kv_preset;
  // KvFamiliesFingerprint: page size and every family in order.
  uint64_t kv_fingerprint = 0;
  uint64_t bytes_per_page = 0;
  uint32_t num_steps = 0;
  std::string host_layout;  // HostLayoutName spelling ("layer_first").
  uint64_t device_pages_per_rank = 0;
  uint64_t host_pages_per_rank = 0;
  uint8_t wire_version = 0;      // group_wire's kWireVersion.
  uint64_t max_frame_bytes = 0;  // comm::kMaxFrameBytes.
  // VersionString() of the build: the frames are only specified per build,
  // so a group runs one build (release and revision).
  std::string build;

  // Not compared by CheckGeometry: the ranks whose pools this member holds
  // (ascending). Checked across members by CheckRankAssignment.
  std::vector<Rank> ranks;

  bool operator==(const GroupGeometry&) const = default;
};

// The geometry of a daemon with `options` and `kv`: the member's ranks are
// options.pool_ranks, else options.served_ranks, else all [0, C). `build`
// defaults to this binary's VersionString().
GroupGeometry GroupGeometryFrom(const EngineOptions& options,
                                const KvGeometry& kv);
GroupGeometry GroupGeometryFrom(const EngineOptions& options,
                                const KvGeometry& kv, std::string build);

// XXH3-64 of a versioned encoding of the page size and every family in
// order (name, bytes per token, layers, draft). The geometry's name is not
// part of it.
uint64_t KvFamiliesFingerprint(const KvGeometry& kv);

// OK when every compared field of `member` equals `leader`'s; otherwise
// FAILED_PRECONDITION "CP group geometry of follower <name> differs from the
// leader's: page_size: leader 64, follower <name> 32; host_layout: ..." with
// every differing field, in declaration order, strings quoted and escaped
// (the member's name escaped too: it may come from the member).
absl::Status CheckGeometry(const GroupGeometry& leader,
                           const GroupGeometry& member,
                           absl::string_view member_name);

struct MemberRanks {
  std::string name;
  std::vector<Rank> ranks;
};

enum class RankCoverage {
  kComplete,  // Every rank of [0, C) must be served (the group forms).
  kPartial,   // Ranks may be missing (members still joining).
};

// OK when the members' ranks partition [0, cp_size): each member's ranks
// non-empty, ascending and consecutive, all below cp_size, no rank served by
// two members, and (kComplete) none served by nobody. Otherwise
// FAILED_PRECONDITION naming every problem ("member b serves no rank; rank 2
// served by both a and c; ranks 5-7 served by no member"). A cp_size of 0 or
// over DaemonConfig::kMaxCpSize is FAILED_PRECONDITION. Member names are
// escaped (C-style) in the message.
absl::Status CheckRankAssignment(
    uint32_t cp_size, absl::Span<const MemberRanks> members,
    RankCoverage coverage = RankCoverage::kComplete);

// "ranks 5-7, rank 9" for a sorted, duplicate-free list ("" for none).
std::string RangesText(const std::vector<Rank>& ranks);

std::string EncodeGroupGeometry(const GroupGeometry& geometry);
absl::StatusOr<GroupGeometry> DecodeGroupGeometry(absl::string_view bytes);

// "P=64 C=4 kv=tiny (fp 0x..., 2048 B/page, 2 steps) layer_first
// device=1024 host=4096 wire=1 frame=16777216 build=... ranks=2-3".
std::string DescribeGroupGeometry(const GroupGeometry& geometry);

}  // namespace hicache::group
