#include "client/ctl/output_format.h"

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;

v1::GetStatsResponse SampleStats() {
  v1::GetStatsResponse stats;
  stats.mutable_build()->set_version("0.1.0");
  stats.mutable_build()->set_compiler("gcc 12.2.0");
  stats.mutable_build()->set_build_mode("opt");
  stats.mutable_build()->set_proto_package("hicache.v1");
  stats.set_backend(v1::BACKEND_CPU);
  v1::PoolGeometry* geo = stats.mutable_geometry();
  geo->set_page_size_tokens(64);
  geo->set_cp_size(2);
  geo->add_served_ranks(0);
  geo->add_served_ranks(1);
  geo->set_device_pages_per_rank(4096);
  geo->set_host_pages_per_rank(16384);
  geo->set_logical_device_pages(8192);
  geo->set_host_layout(v1::HOST_LAYOUT_PAGE_FIRST);
  stats.set_uptime_seconds(3725.0);
  stats.set_listen_address("unix:/tmp/h.sock");
  stats.set_pid(77);
  return stats;
}

TEST(OutputFormatTest, Uptime) {
  EXPECT_EQ(FormatUptime(absl::ZeroDuration()), "0s");
  EXPECT_EQ(FormatUptime(absl::Seconds(59)), "59s");
  EXPECT_EQ(FormatUptime(absl::Seconds(61)), "1m 1s");
  EXPECT_EQ(FormatUptime(absl::Seconds(3600)), "1h 0m");
  EXPECT_EQ(FormatUptime(absl::Seconds(3725)), "1h 2m");
  EXPECT_EQ(FormatUptime(absl::Hours(49)), "2d 1h");
  EXPECT_EQ(FormatUptime(absl::Seconds(-3)), "0s");
}

TEST(OutputFormatTest, HumanStatsNamesEveryField) {
  const std::string text = FormatStatsHuman(SampleStats());
  EXPECT_THAT(text, HasSubstr("hicached 0.1.0 (gcc 12.2.0, opt"));
  EXPECT_THAT(text, HasSubstr("pid:           77"));
  EXPECT_THAT(text, HasSubstr("unix:/tmp/h.sock"));
  EXPECT_THAT(text, HasSubstr("uptime:        1h 2m"));
  EXPECT_THAT(text, HasSubstr("backend:       cpu"));
  EXPECT_THAT(text, HasSubstr("page size:     64 tokens"));
  EXPECT_THAT(text, HasSubstr("cp size:       2 (ranks served: 0,1)"));
  EXPECT_THAT(text, HasSubstr("4096 per rank, 8192 logical"));
  EXPECT_THAT(text, HasSubstr("16384 per rank, page_first"));
}

TEST(OutputFormatTest, JsonRoundTrips) {
  const v1::GetStatsResponse stats = SampleStats();
  absl::StatusOr<std::string> json = ToJson(stats);
  ASSERT_TRUE(json.ok());
  EXPECT_EQ(json->find('\n'), std::string::npos);
  EXPECT_THAT(*json, HasSubstr("\"page_size_tokens\":64"));
  EXPECT_THAT(*json, HasSubstr("\"backend\":\"BACKEND_CPU\""));
  v1::GetStatsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), stats.SerializeAsString());
}

TEST(OutputFormatTest, JsonIncludesDefaults) {
  v1::GetStatsResponse empty;
  absl::StatusOr<std::string> json = ToJson(empty);
  ASSERT_TRUE(json.ok());
  EXPECT_THAT(*json, HasSubstr("\"uptime_seconds\":0"));
}

}  // namespace
}  // namespace hicache::ctl
