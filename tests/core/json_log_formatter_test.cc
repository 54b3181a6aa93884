#include "daemon/core/json_log_formatter.h"

#include <chrono>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/details/log_msg.h"

namespace hicache {
namespace {

using ::testing::EndsWith;

std::string Format(spdlog::level::level_enum level, const std::string& text,
                   std::chrono::system_clock::time_point time) {
  spdlog::details::log_msg msg(time, spdlog::source_loc{}, "hicached", level,
                               spdlog::string_view_t(text.data(), text.size()));
  msg.thread_id = 42;
  spdlog::memory_buf_t out;
  JsonLogFormatter formatter;
  formatter.format(msg, out);
  return std::string(out.data(), out.size());
}

// 2026-12-01T09:43:43.123Z.
const auto kTime = std::chrono::system_clock::time_point(
    std::chrono::milliseconds(1796118223123));

TEST(JsonLogFormatterTest, OneObjectPerLineWithUtcTimestamp) {
  const std::string line = Format(spdlog::level::warn, "pool low", kTime);
  EXPECT_EQ(line,
            "{\"ts\":\"2026-12-01T09:43:43.123Z\",\"level\":\"warning\","
            "\"logger\":\"hicached\",\"thread\":42,\"msg\":\"pool low\"}\n");
}

TEST(JsonLogFormatterTest, EscapesQuotesNewlinesAndControlCharacters) {
  const std::string text = "client \"a\"\nb\\c\t\x01";
  const std::string line = Format(spdlog::level::info, text, kTime);
  ASSERT_THAT(line, EndsWith("}\n"));
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;
  const nlohmann::json json = nlohmann::json::parse(line);
  EXPECT_EQ(json["msg"], text);
  EXPECT_EQ(json["level"], "info");
}

TEST(JsonLogFormatterTest, InvalidUtf8IsReplacedNotThrown) {
  const std::string line =
      Format(spdlog::level::err, std::string("name \xff\xfe end"), kTime);
  const nlohmann::json json =
      nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(json.is_discarded()) << line;
  EXPECT_EQ(json["msg"], "name \xEF\xBF\xBD\xEF\xBF\xBD end");
}

TEST(JsonLogFormatterTest, CloneFormatsTheSame) {
  JsonLogFormatter formatter;
  std::unique_ptr<spdlog::formatter> clone = formatter.clone();
  const std::string text = "x";
  spdlog::details::log_msg msg(kTime, spdlog::source_loc{}, "hicached",
                               spdlog::level::info,
                               spdlog::string_view_t(text.data(), 1));
  spdlog::memory_buf_t a, b;
  formatter.format(msg, a);
  clone->format(msg, b);
  EXPECT_EQ(std::string(a.data(), a.size()), std::string(b.data(), b.size()));
}

}  // namespace
}  // namespace hicache
