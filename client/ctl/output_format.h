#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_field.h"
#include "hicache/v1/hicache.pb.h"
#include "nlohmann/json.hpp"

namespace hicache::ctl {

// hicachectl's JSON value type: objects keep their fields in insertion
// (proto field) order.
using Json = nlohmann::ordered_json;

// Human-readable multi-line summary of GetStats, ending in '\n'. A daemon
// in a CP group gets a "CP group" block at the end (FormatCpGroupHuman);
// a standalone daemon none.
std::string FormatStatsHuman(const v1::GetStatsResponse& stats);

// The "CP group" block: name, role, state, epoch, leader address, then one
// line per member (index, name, ranks as ranges, health, last-heard age,
// readmissions, reason). Ends in '\n'. Names and reasons come from the
// daemon: control bytes in them are shown escaped.
std::string FormatCpGroupHuman(const v1::CpGroupStatus& group);

// Ranks as ascending ranges: {0,1,2,3,6} -> "0-3,6"; {} -> "none".
// Duplicates are shown once.
std::string FormatRankRanges(
    const google::protobuf::RepeatedField<uint32_t>& ranks);

// GetStats as JSON (ProtoToJson), without "cp_group" for a standalone
// daemon (so its output is what it was before CP groups).
Json StatsToJson(const v1::GetStatsResponse& stats);

// "3d 4h 5m 6s" style: the two most significant non-zero units, "0s" minimum.
std::string FormatUptime(absl::Duration uptime);

// Largest magnitude a double holds exactly for every integer up to it.
inline constexpr int64_t kMaxExactJsonInteger = int64_t{1} << 53;

// Any message as JSON: proto field names, every field (defaults included),
// enums by name, bytes as base64. 64-bit integers are JSON numbers when
// |value| <= 2^53 (a double holds them exactly) and decimal strings
// otherwise; protobuf's JSON parser accepts both forms, so the output parses
// back into the message. Unset oneof members are left out; map fields
// become objects.
Json ProtoToJson(const google::protobuf::Message& message);

// `value` on one line (no newline at the end). Never throws: invalid UTF-8
// in strings is replaced by U+FFFD.
std::string JsonLine(const Json& value);

}  // namespace hicache::ctl
