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

// GetStats as JSON (ProtoToJson): no "cp_group" for a standalone daemon, and
// only the parts of it the daemon filled.
Json StatsToJson(const v1::GetStatsResponse& stats);

// "3d 4h 5m 6s" style: the two most significant non-zero units, "0s" minimum.
std::string FormatUptime(absl::Duration uptime);

// Any message as canonical proto3 JSON, printed by protobuf's own printer
// (MessageToJsonString) with the proto field names and every scalar field
// (defaults included): enums by name, 64-bit integers as decimal strings,
// bytes as base64, NaN and infinities as strings, unset submessages and
// oneof members left out, maps as objects. protobuf's JSON parser reads it
// back into the message.
Json ProtoToJson(const google::protobuf::Message& message);

// `value` on one line (no newline at the end). Never throws: invalid UTF-8
// in strings is replaced by U+FFFD.
std::string JsonLine(const Json& value);

}  // namespace hicache::ctl
