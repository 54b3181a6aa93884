#pragma once

// How the daemon logs: one stderr logger named "hicached" (journald and
// Kubernetes collect stderr), in UTC, as text or as JSON lines.
//
//   text: 2026-12-01T09:43:43.123Z info [1234] message
//   json: {"ts":"2026-12-01T09:43:43.123Z","level":"info",...}  (see
//         json_log_formatter.h)

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace hicache {

enum class LogFormat { kText, kJson };

struct LogOptions {
  std::string level = "info";  // trace, debug, info, warn, error, critical, off
  LogFormat format = LogFormat::kText;
};

// Parses "text" or "json". For absl flags (AbslParseFlag/AbslUnparseFlag).
bool AbslParseFlag(absl::string_view text, LogFormat* format,
                   std::string* error);
std::string AbslUnparseFlag(LogFormat format);

// Installs the daemon's default logger. INVALID_ARGUMENT, and nothing
// changes, for an unknown level. Call once, before other threads log.
absl::Status ConfigureLogging(const LogOptions& options);

}  // namespace hicache
