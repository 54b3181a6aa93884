#include "daemon/core/log_setup.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "daemon/core/json_log_formatter.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace hicache {

bool AbslParseFlag(absl::string_view text, LogFormat* format,
                   std::string* error) {
  if (text == "text") {
    *format = LogFormat::kText;
    return true;
  }
  if (text == "json") {
    *format = LogFormat::kJson;
    return true;
  }
  *error = "expected 'text' or 'json'";
  return false;
}

std::string AbslUnparseFlag(LogFormat format) {
  return format == LogFormat::kJson ? "json" : "text";
}

absl::Status ConfigureLogging(const LogOptions& options) {
  const spdlog::level::level_enum level =
      spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_level: unknown level '", options.level,
        "'; expected trace, debug, info, warn, error, critical or off"));
  }
  std::shared_ptr<spdlog::logger> logger = spdlog::get("hicached");
  if (logger == nullptr) logger = spdlog::stderr_color_mt("hicached");
  if (options.format == LogFormat::kJson) {
    logger->set_formatter(std::make_unique<JsonLogFormatter>());
  } else {
    logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        "%Y-%m-%dT%H:%M:%S.%eZ %^%l%$ [%t] %v", spdlog::pattern_time_type::utc));
  }
  logger->set_level(level);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace hicache
