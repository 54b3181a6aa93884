#include "daemon/events/kv_event_topics.h"

#include "gtest/gtest.h"

namespace hicache::events {
namespace {

KvEventTopics Make(std::string tmpl = "kv@{instance}@{model}") {
  absl::StatusOr<KvEventTopics> topics = KvEventTopics::Create(
      {.topic_template = std::move(tmpl), .instance = "node-1"});
  EXPECT_TRUE(topics.ok()) << topics.status();
  return *std::move(topics);
}

TEST(KvEventTopicsTest, DefaultsNameTheNamespaceAsTheModel) {
  KvEventTopics topics = Make();
  EXPECT_EQ(topics.TopicOf(""), "kv@node-1@default");
  EXPECT_EQ(topics.TopicOf("tenant-a"), "kv@node-1@tenant-a");
}

TEST(KvEventTopicsTest, ADeclarationMovesOnlyItsNamespace) {
  KvEventTopics topics = Make();
  ASSERT_EQ(topics.TopicOf("a"), "kv@node-1@a");
  absl::StatusOr<std::string> declared =
      topics.Declared("a", "pod-7", "Qwen/Qwen3-8B");
  ASSERT_TRUE(declared.ok()) << declared.status();
  EXPECT_EQ(*declared, "kv@pod-7@Qwen/Qwen3-8B");
  topics.Assign("a", *declared);
  EXPECT_EQ(topics.TopicOf("a"), "kv@pod-7@Qwen/Qwen3-8B");
  EXPECT_EQ(topics.TopicOf("b"), "kv@node-1@b");
}

TEST(KvEventTopicsTest, TwoNamespacesNeverShareATopic) {
  KvEventTopics topics = Make();
  topics.Assign("a", *topics.Declared("a", "pod", "m"));
  // Another namespace declaring the same identity is refused.
  absl::StatusOr<std::string> clash = topics.Declared("b", "pod", "m");
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition);
  // A namespace whose default would be a declared topic gets its own.
  topics.Assign("x", *topics.Declared("x", "node-1", "y"));
  EXPECT_EQ(topics.TopicOf("x"), "kv@node-1@y");
  EXPECT_EQ(topics.TopicOf("y"), "kv@node-1@y/y");
  // Re-declaring one's own topic is fine.
  EXPECT_TRUE(topics.Declared("a", "pod", "m").ok());
}

TEST(KvEventTopicsTest, RefusesTemplatesAndNamesThatMixNamespaces) {
  EXPECT_FALSE(KvEventTopics::Create({.topic_template = "kv@{instance}",
                                      .instance = "n"})
                   .ok());
  EXPECT_TRUE(KvEventTopics::Create({.topic_template = "kv/{namespace}",
                                     .instance = "n"})
                  .ok());
  EXPECT_FALSE(KvEventTopics::Create({.instance = ""}).ok());
  for (const char* bad : {"", "a@b", "a b", "{model}", "tab\t", "\x7f"}) {
    EXPECT_FALSE(KvEventTopics::ValidateName("event_model", bad).ok()) << bad;
  }
  EXPECT_FALSE(
      KvEventTopics::ValidateName("event_model", std::string(257, 'a')).ok());
  EXPECT_TRUE(KvEventTopics::ValidateName("event_model", "Qwen/Qwen3-8B").ok());
}

}  // namespace
}  // namespace hicache::events
