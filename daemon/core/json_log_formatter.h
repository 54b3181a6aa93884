#pragma once

// An spdlog formatter that writes each record as one JSON object on one line,
// for log collectors (journald, Loki, Fluent Bit) that parse structured logs:
//
//   {"ts":"2026-12-01T09:43:43.123Z","level":"info","logger":"hicached",
//    "thread":1234,"msg":"..."}
//
// Contract:
//  * `ts` is UTC, RFC 3339 with milliseconds and a `Z` suffix, whatever the
//    machine's time zone.
//  * `msg` is the formatted message, JSON-escaped; bytes that are not valid
//    UTF-8 (a client-supplied name, say) are replaced by U+FFFD, so every line
//    parses. Nothing here throws.
//  * Every record ends with exactly one '\n'.

#include <memory>

#include "spdlog/formatter.h"

namespace hicache {

class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

}  // namespace hicache
