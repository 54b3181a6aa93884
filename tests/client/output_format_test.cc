#include "client/ctl/output_format.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace hicache::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

v1::GetStatsResponse SampleStats() {
  v1::GetStatsResponse stats;
  stats.mutable_build()->set_version("0.1.0");
  stats.mutable_build()->set_compiler("gcc 12.2.0");
  stats.mutable_build()->set_git_revision("0123abcd");
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
  EXPECT_THAT(text, HasSubstr("hicached 0.1.0 (git 0123abcd, gcc 12.2.0, opt"));
  EXPECT_THAT(text, HasSubstr("pid:           77"));
  EXPECT_THAT(text, HasSubstr("unix:/tmp/h.sock"));
  EXPECT_THAT(text, HasSubstr("uptime:        1h 2m"));
  EXPECT_THAT(text, HasSubstr("backend:       cpu"));
  EXPECT_THAT(text, HasSubstr("page size:     64 tokens"));
  EXPECT_THAT(text, HasSubstr("cp size:       2 (ranks served: 0,1)"));
  EXPECT_THAT(text, HasSubstr("4096 per rank, 8192 logical"));
  EXPECT_THAT(text, HasSubstr("16384 per rank, page_first"));
}

TEST(OutputFormatTest, JsonRoundTripsThroughProtobufsParser) {
  const v1::GetStatsResponse stats = SampleStats();
  const std::string json = JsonLine(ProtoToJson(stats));
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_THAT(json, HasSubstr("\"page_size_tokens\":64"));
  EXPECT_THAT(json, HasSubstr("\"backend\":\"BACKEND_CPU\""));
  // int64: a decimal string, as proto3's JSON mapping has it.
  EXPECT_THAT(json, HasSubstr("\"pid\":\"77\""));
  v1::GetStatsResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), stats.SerializeAsString());
}

TEST(OutputFormatTest, JsonIncludesDefaults) {
  const Json json = ProtoToJson(v1::GetStatsResponse());
  EXPECT_EQ(json["uptime_seconds"], 0.0);
  EXPECT_EQ(json["pid"], "0");
  EXPECT_EQ(json["listen_address"], "");
  EXPECT_EQ(json["backend"], "BACKEND_UNSPECIFIED");
  // Unset messages are left out; a set one prints its defaults.
  EXPECT_FALSE(json.contains("geometry"));
  v1::GetStatsResponse with_geometry;
  with_geometry.mutable_geometry();
  EXPECT_TRUE(ProtoToJson(with_geometry)["geometry"]["served_ranks"].is_array());
}

// 64-bit integers are decimal strings (proto3's JSON mapping: no JSON
// reader rounds them), 32-bit ones numbers; protobuf's parser reads them
// back.
TEST(OutputFormatTest, SixtyFourBitIntegersAreDecimalStrings) {
  v1::CacheStats stats;
  stats.set_bytes_to_host(int64_t{1} << 53);
  stats.set_bytes_to_device((int64_t{1} << 53) + 1);
  stats.set_nodes(-(int64_t{1} << 53));
  stats.set_match_calls(std::numeric_limits<int64_t>::max());
  const Json json = ProtoToJson(stats);
  EXPECT_EQ(json["bytes_to_host"], "9007199254740992");
  EXPECT_EQ(json["bytes_to_device"], "9007199254740993");
  EXPECT_EQ(json["nodes"], "-9007199254740992");
  EXPECT_EQ(json["match_calls"], "9223372036854775807");

  v1::NodeInfo node;  // uint64 and repeated int64.
  node.set_id(std::numeric_limits<uint64_t>::max());
  node.set_parent(42);
  node.add_device_pages(7);
  node.add_device_pages(int64_t{1} << 60);
  const std::string line = JsonLine(ProtoToJson(node));
  EXPECT_THAT(line, HasSubstr("\"id\":\"18446744073709551615\""));
  EXPECT_THAT(line, HasSubstr("\"parent\":\"42\""));
  EXPECT_THAT(line,
              HasSubstr("\"device_pages\":[\"7\",\"1152921504606846976\"]"));
  v1::NodeInfo parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), node.SerializeAsString());
  v1::CacheStats parsed_stats;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  JsonLine(ProtoToJson(stats)), &parsed_stats)
                  .ok());
  EXPECT_EQ(parsed_stats.SerializeAsString(), stats.SerializeAsString());
}

// Strings are escaped by the JSON library, not by hand: quotes, backslashes,
// control characters and invalid UTF-8 still give one valid document.
TEST(OutputFormatTest, StringsAreEscaped) {
  v1::SessionSummary session;
  session.set_client_name("a\"b\\c\n\x01");
  session.set_namespace_(std::string("bad\xff utf8"));
  const std::string line = JsonLine(ProtoToJson(session));
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const Json parsed = Json::parse(line);
  EXPECT_EQ(parsed["client_name"], "a\"b\\c\n\x01");
  // protobuf's printer drops what is not UTF-8.
  EXPECT_EQ(parsed["namespace"], "bad utf8");
}

TEST(OutputFormatTest, BytesAreBase64AndOneofsOnlyWhenSet) {
  v1::DumpTreeRequest request;
  request.set_prefix(std::string("\x01\x00\x00\x00", 4));
  request.set_sort(v1::TREE_SORT_HITS);
  const Json json = ProtoToJson(request);
  EXPECT_EQ(json["prefix"], "AQAAAA==");
  EXPECT_EQ(json["sort"], "TREE_SORT_HITS");
}

TEST(OutputFormatTest, RankRanges) {
  auto ranges = [](std::vector<uint32_t> v) {
    google::protobuf::RepeatedField<uint32_t> f(v.begin(), v.end());
    return FormatRankRanges(f);
  };
  EXPECT_EQ(ranges({}), "none");
  EXPECT_EQ(ranges({3}), "3");
  EXPECT_EQ(ranges({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(ranges({6, 0, 2, 1, 3}), "0-3,6");
  EXPECT_EQ(ranges({1, 1, 2, 5, 7, 8}), "1-2,5,7-8");
  EXPECT_EQ(ranges({4294967295u, 4294967294u}), "4294967294-4294967295");
}

TEST(OutputFormatTest, StandaloneStatsHaveNoGroup) {
  const v1::GetStatsResponse stats = SampleStats();
  EXPECT_THAT(FormatStatsHuman(stats), Not(HasSubstr("CP group")));
  const Json json = StatsToJson(stats);
  EXPECT_FALSE(json.contains("cp_group"));
  // Everything else is ProtoToJson's.
  Json all = ProtoToJson(stats);
  all.erase("cp_group");
  EXPECT_EQ(json, all);
}

TEST(OutputFormatTest, CpGroupBlockEscapesTheDaemonsStrings) {
  v1::GetStatsResponse stats = SampleStats();
  v1::CpGroupStatus* g = stats.mutable_cp_group();
  g->set_name("g\n\x1b[31mX");
  g->set_role("follower");
  g->set_state("degraded");
  g->set_reason("leader lost: link closed");
  v1::CpGroupMember* m = g->add_members();
  m->set_name("evil\nname");
  m->set_health("dead");
  m->set_reason("bye\r");
  const std::string text = FormatStatsHuman(stats);
  EXPECT_THAT(text, HasSubstr("  name:        g\\n\\x1b[31mX\n"));
  EXPECT_THAT(text, HasSubstr("  leader:      unknown\n"));
  EXPECT_THAT(text, HasSubstr("  reason:      leader lost: link closed\n"));
  EXPECT_THAT(text, HasSubstr("evil\\nname"));
  EXPECT_THAT(text, HasSubstr("  bye\\r\n"));
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  // JSON keeps them as they are (escaped by JSON itself).
  EXPECT_EQ(StatsToJson(stats)["cp_group"]["name"], "g\n\x1b[31mX");
}

TEST(OutputFormatTest, CpGroupWithoutMembers) {
  v1::CpGroupStatus g;
  g.set_role("leader");
  EXPECT_THAT(FormatCpGroupHuman(g), HasSubstr("  members:     none\n"));
  EXPECT_THAT(FormatCpGroupHuman(g), HasSubstr("  name:        -\n"));
}

TEST(OutputFormatTest, CpGroupLeaderShowsEachMembersDataPath) {
  v1::GetStatsResponse stats = SampleStats();
  v1::CpGroupStatus* g = stats.mutable_cp_group();
  g->set_role("leader");
  g->add_members()->set_name("leader");  // Itself: no data path.
  v1::CpGroupMember* m = g->add_members();
  m->set_index(1);
  m->set_name("node-b");
  v1::CpGroupMemberTransfer* t = m->mutable_transfer();
  t->set_steps_sent(12);
  t->set_steps_completed(11);
  t->set_steps_failed(1);
  t->set_outstanding(0);
  t->set_step_timeouts(0);
  t->set_digests_sent(3);
  t->set_digests_matched(3);
  t->set_digest_divergences(0);
  t->set_last_digest_match_age_ms(1500);
  v1::CpGroupMemberEvents* e = m->mutable_events();
  e->set_events_sent(40);
  e->set_frames_sent(10);
  e->set_events_waiting(2);
  v1::CpGroupMember* fresh = g->add_members();
  fresh->set_index(2);
  fresh->mutable_transfer()->set_last_digest_match_age_ms(-1);
  fresh->mutable_events()->set_failed(true);
  const std::string text = FormatStatsHuman(stats);
  EXPECT_THAT(text, HasSubstr("  data path:\n"
                              "    1  steps 12 sent, 11 done, 1 failed, 0 "
                              "outstanding, 0 timeouts; digests 3 sent, 3 "
                              "matched, 0 diverged (last match 1.5s ago); "
                              "events 40 sent in 10 frames, 2 waiting\n"));
  EXPECT_THAT(text, HasSubstr("    2  steps 0 sent, 0 done, 0 failed, 0 "
                              "outstanding, 0 timeouts; digests 0 sent, 0 "
                              "matched, 0 diverged (no match yet); events 0 "
                              "sent in 0 frames, 0 waiting (FAILED)\n"));
  EXPECT_THAT(text, Not(HasSubstr("    0  steps")));
  EXPECT_THAT(text, Not(HasSubstr("executor:")));

  const Json json = StatsToJson(stats);
  EXPECT_FALSE(json["cp_group"].contains("follower"));
  EXPECT_FALSE(json["cp_group"]["members"][0].contains("transfer"));
  EXPECT_FALSE(json["cp_group"]["members"][0].contains("events"));
  EXPECT_EQ(json["cp_group"]["members"][1]["transfer"]["steps_completed"], "11");
  EXPECT_EQ(json["cp_group"]["members"][1]["transfer"]["digest_divergences"],
            "0");
  EXPECT_EQ(json["cp_group"]["members"][1]["events"]["events_sent"], "40");
  EXPECT_EQ(json["cp_group"]["members"][2]["events"]["failed"], true);
}

TEST(OutputFormatTest, CpGroupFollowerShowsItsExecutorAndAcks) {
  v1::GetStatsResponse stats = SampleStats();
  v1::CpGroupStatus* g = stats.mutable_cp_group();
  g->set_role("follower");
  g->add_members()->set_name("10.0.0.1:7071");
  v1::CpGroupFollowerStats* f = g->mutable_follower();
  f->set_tasks_received(5);
  f->set_steps_executed(20);
  f->set_steps_refused(1);
  f->set_steps_rejected(2);
  f->set_pending(3);
  f->set_digests_checked(4);
  f->set_digests_matched(4);
  f->set_last_digest_match_age_ms(-1);
  f->set_acks_relayed(7);
  f->set_acks_failed(1);
  std::string text = FormatStatsHuman(stats);
  EXPECT_THAT(text, HasSubstr("  executor:    5 tasks; steps 20 executed, 1 "
                              "refused, 2 rejected, 3 pending; digests 4 "
                              "checked, 4 matched (no match yet)\n"
                              "  worker acks: 7 relayed, 1 failed\n"));
  EXPECT_THAT(text, Not(HasSubstr("data path:")));
  f->set_diverged(true);
  f->set_last_digest_match_age_ms(250);
  text = FormatStatsHuman(stats);
  EXPECT_THAT(text, HasSubstr("(last match 250ms ago); DIVERGED\n"));

  const Json json = StatsToJson(stats);
  EXPECT_EQ(json["cp_group"]["follower"]["steps_executed"], "20");
  EXPECT_EQ(json["cp_group"]["follower"]["acks_relayed"], "7");
  EXPECT_EQ(json["cp_group"]["follower"]["diverged"], true);
  EXPECT_FALSE(json["cp_group"]["members"][0].contains("transfer"));
}

}  // namespace
}  // namespace hicache::ctl
