#include "daemon/core/json_log_formatter.h"

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "spdlog/common.h"

namespace hicache {
namespace {

std::string Quoted(spdlog::string_view_t text) {
  return nlohmann::json(std::string(text.data(), text.size()))
      .dump(-1, ' ', /*ensure_ascii=*/false,
            nlohmann::json::error_handler_t::replace);
}

void Append(spdlog::memory_buf_t& dest, const std::string& text) {
  dest.append(text.data(), text.data() + text.size());
}

}  // namespace

void JsonLogFormatter::format(const spdlog::details::log_msg& msg,
                              spdlog::memory_buf_t& dest) {
  const absl::Time time = absl::FromChrono(msg.time);
  std::string line = "{\"ts\":\"";
  line += absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone());
  line += "\",\"level\":";
  const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
  line += Quoted(level);
  line += ",\"logger\":";
  line += Quoted(msg.logger_name);
  line += ",\"thread\":";
  line += std::to_string(msg.thread_id);
  line += ",\"msg\":";
  line += Quoted(msg.payload);
  line += "}\n";
  Append(dest, line);
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const {
  return std::make_unique<JsonLogFormatter>();
}

}  // namespace hicache
