#include "daemon/core/log_setup.h"

#include <string>

#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace hicache {
namespace {

TEST(LogSetupTest, ParsesFormats) {
  LogFormat format = LogFormat::kText;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("json", &format, &error));
  EXPECT_EQ(format, LogFormat::kJson);
  EXPECT_TRUE(AbslParseFlag("text", &format, &error));
  EXPECT_EQ(format, LogFormat::kText);
  EXPECT_FALSE(AbslParseFlag("JSON ", &format, &error));
  EXPECT_EQ(error, "expected 'text' or 'json'");
  EXPECT_EQ(AbslUnparseFlag(LogFormat::kJson), "json");
  EXPECT_EQ(AbslUnparseFlag(LogFormat::kText), "text");
}

TEST(LogSetupTest, UnknownLevelIsRefusedAndChangesNothing) {
  ASSERT_TRUE(ConfigureLogging({.level = "warn"}).ok());
  const absl::Status status = ConfigureLogging({.level = "loud"});
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::warn);
}

TEST(LogSetupTest, InstallsTheNamedDefaultLoggerOnce) {
  ASSERT_TRUE(ConfigureLogging({.level = "debug"}).ok());
  ASSERT_TRUE(
      ConfigureLogging({.level = "off", .format = LogFormat::kJson}).ok());
  EXPECT_EQ(spdlog::default_logger()->name(), "hicached");
  EXPECT_EQ(spdlog::default_logger().get(), spdlog::get("hicached").get());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::off);
}

}  // namespace
}  // namespace hicache
