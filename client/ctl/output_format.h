#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "hicache/v1/hicache.pb.h"

namespace hicache::ctl {

// Human-readable multi-line summary of GetStats, ending in '\n'.
std::string FormatStatsHuman(const v1::GetStatsResponse& stats);

// "3d 4h 5m 6s" style: the two most significant non-zero units, "0s" minimum.
std::string FormatUptime(absl::Duration uptime);

// One-line JSON of any message, proto field names kept, defaults included.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message);

}  // namespace hicache::ctl
