#include "daemon/metrics/label_values.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache::metrics {
namespace {

TEST(EscapeLabelValueTest, KeepsPrintableAsciiAndEscapesEverythingElse) {
  EXPECT_EQ(EscapeLabelValue("tenant-a"), "tenant-a");
  EXPECT_EQ(EscapeLabelValue("say \"hi\""), "say \"hi\"");
  EXPECT_EQ(EscapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeLabelValue("a\nb"), "a\\x0ab");
  EXPECT_EQ(EscapeLabelValue(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(EscapeLabelValue("\xc3\xa9\xff"), "\\xc3\\xa9\\xff");
  EXPECT_EQ(EscapeLabelValue(""), "");
}

TEST(EscapeLabelValueTest, IsInjective) {
  // A literal "\x0a" and a newline must not share a label.
  EXPECT_NE(EscapeLabelValue("\\x0a"), EscapeLabelValue("\n"));
  EXPECT_NE(EscapeLabelValue("\\\\"), EscapeLabelValue("\\"));
}

NamespaceRow Row(std::string ns, int64_t device, int64_t host = 0,
                 int64_t sessions = 0) {
  NamespaceRow row;
  row.ns = std::move(ns);
  row.nodes = 1;
  row.device_tokens = device;
  row.host_tokens = host;
  row.sessions = sessions;
  return row;
}

std::vector<std::string> Names(const std::vector<NamespaceRow>& rows) {
  std::vector<std::string> names;
  for (const NamespaceRow& row : rows) names.push_back(row.ns);
  return names;
}

TEST(TopNamespacesTest, KeepsTheLargestAndSumsTheRestIntoOther) {
  std::vector<NamespaceRow> rows = {Row("small", 1), Row("big", 100),
                                    Row("host", 0, 50), Row("mid", 10, 5)};
  std::vector<NamespaceRow> top = TopNamespaces(rows, 2);
  EXPECT_THAT(Names(top), ::testing::ElementsAre("big", "host", kOtherNamespace));
  EXPECT_EQ(top[2].device_tokens, 11);
  EXPECT_EQ(top[2].host_tokens, 5);
  EXPECT_EQ(top[2].nodes, 2);
}

TEST(TopNamespacesTest, NoOtherRowWhenEverythingFits) {
  std::vector<NamespaceRow> top = TopNamespaces({Row("a", 1), Row("b", 2)}, 2);
  EXPECT_THAT(Names(top), ::testing::ElementsAre("b", "a"));
  EXPECT_TRUE(TopNamespaces({}, 5).empty());
}

TEST(TopNamespacesTest, TiesAreBrokenByNameSoScrapesAreStable) {
  std::vector<NamespaceRow> top =
      TopNamespaces({Row("c", 5), Row("a", 5), Row("b", 5)}, 2);
  EXPECT_THAT(Names(top), ::testing::ElementsAre("a", "b", kOtherNamespace));
}

TEST(TopNamespacesTest, SessionsRankNamespacesWithoutCachedTokens) {
  std::vector<NamespaceRow> top =
      TopNamespaces({Row("idle", 0, 0, 0), Row("busy", 0, 0, 3)}, 1);
  EXPECT_THAT(Names(top), ::testing::ElementsAre("busy", kOtherNamespace));
  EXPECT_EQ(top[1].sessions, 0);
}

TEST(TopNamespacesTest, ALiteralOtherNamespaceIsAlwaysFolded) {
  std::vector<NamespaceRow> top =
      TopNamespaces({Row(kOtherNamespace, 1000), Row("a", 1)}, 5);
  EXPECT_THAT(Names(top), ::testing::ElementsAre("a", kOtherNamespace));
  EXPECT_EQ(top[1].device_tokens, 1000);
}

TEST(TopNamespacesTest, AHostileClientsThousandsOfNamespacesStayBounded) {
  std::vector<NamespaceRow> rows;
  for (int i = 0; i < 5000; ++i) {
    rows.push_back(Row(absl::StrCat("evil\n", i), i % 7));
  }
  std::vector<NamespaceRow> top = TopNamespaces(rows, 20);
  ASSERT_EQ(top.size(), 21u);
  int64_t sum = 0;
  for (const NamespaceRow& row : top) {
    sum += row.device_tokens;
    EXPECT_EQ(row.ns.find('\n'), std::string::npos);
  }
  int64_t expected = 0;
  for (const NamespaceRow& row : rows) expected += row.device_tokens;
  EXPECT_EQ(sum, expected);
}

}  // namespace
}  // namespace hicache::metrics
