#include "daemon/core/kv_layout.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

std::vector<KvFamily> KV(uint32_t row, uint32_t layers) {
  return {{"k", row, layers, false}, {"v", row, layers, false}};
}

TEST(KvLayoutTest, AttentionGivesKAndVRowsOfHeadsTimesHeadDim) {
  absl::StatusOr<KvLayout> layout = ParseKvLayout(R"({
      "name": "llama-3-8b",
      "attention": {"layers": 32, "kv_heads": 8, "head_dim": 128,
                    "dtype": "bf16"}})");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->name, "llama-3-8b");
  EXPECT_EQ(layout->families, KV(2048, 32));
}

TEST(KvLayoutTest, TensorParallelWorkersHoldTheirShareOfHeads) {
  auto families = [](const std::string& attention) {
    absl::StatusOr<KvLayout> layout = ParseKvLayout(
        R"({"name": "m", "attention": )" + attention + "}");
    EXPECT_TRUE(layout.ok()) << layout.status();
    return layout.ok() ? layout->families : std::vector<KvFamily>{};
  };
  // 8 heads over 2 workers: 4 each.
  EXPECT_EQ(families(R"({"layers": 2, "kv_heads": 8, "head_dim": 128,
                         "tp_size": 2})"),
            KV(1024, 2));
  // More workers than heads: each holds one (replicated) head.
  EXPECT_EQ(families(R"({"layers": 2, "kv_heads": 8, "head_dim": 128,
                         "tp_size": 16})"),
            KV(256, 2));
  // Dtypes: fp8 halves bf16, fp32 doubles it; bf16 is the default.
  EXPECT_EQ(families(R"({"layers": 1, "kv_heads": 1, "head_dim": 64,
                         "dtype": "fp8"})"),
            KV(64, 1));
  EXPECT_EQ(families(R"({"layers": 1, "kv_heads": 1, "head_dim": 64,
                         "dtype": "fp32"})"),
            KV(256, 1));
  EXPECT_EQ(families(R"({"layers": 1, "kv_heads": 1, "head_dim": 64})"),
            KV(128, 1));
  // A draft (MTP) stack of the same heads.
  const std::vector<KvFamily> with_draft = families(
      R"({"layers": 3, "kv_heads": 2, "head_dim": 64, "draft_layers": 1})");
  EXPECT_EQ(with_draft,
            (std::vector<KvFamily>{{"k", 256, 3, false},
                                   {"v", 256, 3, false},
                                   {"draft_k", 256, 1, true},
                                   {"draft_v", 256, 1, true}}));
}

TEST(KvLayoutTest, FamiliesAreTakenRowByRowAfterTheAttentionOnes) {
  absl::StatusOr<KvLayout> layout = ParseKvLayout(R"({
      "name": "mixed.v1",
      "attention": {"layers": 2, "kv_heads": 1, "head_dim": 16},
      "families": [{"name": "indexer_k", "bytes_per_token": 132,
                    "layers": 2},
                   {"name": "draft_mla", "bytes_per_token": 1152,
                    "layers": 1, "draft": true}]})");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->families,
            (std::vector<KvFamily>{{"k", 32, 2, false},
                                   {"v", 32, 2, false},
                                   {"indexer_k", 132, 2, false},
                                   {"draft_mla", 1152, 1, true}}));
}

// A careless or hostile file is refused with the key that is wrong (sizes
// themselves are KvGeometry::Create's to check).
TEST(KvLayoutTest, BadDescriptionsNameWhatIsWrong) {
  struct Case {
    std::string json;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"{\"name\": \"m\",", "not valid JSON"},
      {"[1, 2]", "the top level must be an object"},
      {R"({"attention": {"layers": 1, "kv_heads": 1, "head_dim": 8}})",
       "'name' is missing"},
      {R"({"name": "", "families": []})", "name must be 1 to 64"},
      {R"({"name": "a b", "families": []})", "name must be 1 to 64"},
      {R"({"name": "../etc", "families": []})", "name must be 1 to 64"},
      {R"({"name": 7, "families": []})", "'name' must be a string"},
      {R"({"name": "m"})", "give 'attention' or a non-empty 'families'"},
      {R"({"name": "m", "families": []})",
       "give 'attention' or a non-empty 'families'"},
      {R"({"name": "m", "families": {}})", "'families' must be an array"},
      {R"({"name": "m", "famlies": []})", "unknown key 'famlies'"},
      {R"({"name": "m", "attention": []})", "'attention' must be an object"},
      {R"({"name": "m", "attention": {"layer": 1}})",
       "unknown key 'layer' in attention"},
      {R"({"name": "m", "attention": {"layers": 2, "head_dim": 8}})",
       "'kv_heads' is missing"},
      {R"({"name": "m", "attention": {"layers": "32", "kv_heads": 1,
           "head_dim": 8}})",
       "'layers' must be an integer"},
      {R"({"name": "m", "attention": {"layers": -1, "kv_heads": 1,
           "head_dim": 8}})",
       "'layers' must be an integer"},
      {R"({"name": "m", "attention": {"layers": 2.5, "kv_heads": 1,
           "head_dim": 8}})",
       "'layers' must be an integer"},
      {R"({"name": "m", "attention": {"layers": 4294967296, "kv_heads": 1,
           "head_dim": 8}})",
       "'layers' must be an integer in [0, 4294967295]"},
      {R"({"name": "m", "attention": {"layers": 1, "kv_heads": 0,
           "head_dim": 8}})",
       "'kv_heads' must be at least 1"},
      {R"({"name": "m", "attention": {"layers": 1, "kv_heads": 1,
           "head_dim": 8, "tp_size": 0}})",
       "'tp_size' must be at least 1"},
      {R"({"name": "m", "attention": {"layers": 0, "kv_heads": 1,
           "head_dim": 8}})",
       "must be at least 1"},
      {R"({"name": "m", "attention": {"layers": 1, "kv_heads": 65536,
           "head_dim": 65536, "dtype": "fp32"}})",
       "too large"},
      {R"({"name": "m", "attention": {"layers": 1, "kv_heads": 1,
           "head_dim": 8, "dtype": "int4"}})",
       "unknown dtype 'int4'"},
      {R"({"name": "m", "families": [3]})", "families[0] must be an object"},
      {R"({"name": "m", "families": [{"name": "k", "layers": 1}]})",
       "families[0]: 'bytes_per_token' is missing"},
      {R"({"name": "m", "families": [{"name": "k", "bytes_per_token": 8,
           "layers": 1, "draft": "yes"}]})",
       "'draft' must be true or false"},
      {R"({"name": "m", "families": [{"name": "k", "bytes_per_token": 8,
           "layers": 1, "stride": 2}]})",
       "unknown key 'stride' in families[0]"},
      {R"({"name": "m", "families": [{"name": "k/v", "bytes_per_token": 8,
           "layers": 1}]})",
       "families[0]: name must be"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<KvLayout> layout = ParseKvLayout(c.json);
    ASSERT_FALSE(layout.ok()) << c.json;
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument)
        << c.json;
    EXPECT_THAT(layout.status().message(), HasSubstr(c.message)) << c.json;
  }
}

TEST(KvLayoutTest, FilesAreReadWholeAndErrorsNameThePath) {
  testing::TempDir dir;
  const std::string good = dir.Child("good.json");
  const std::string bad = dir.Child("bad.json");
  const std::string big = dir.Child("big.json");
  auto write = [](const std::string& path, const std::string& text) {
    FILE* f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fwrite(text.data(), 1, text.size(), f);
    fclose(f);
  };
  write(good, R"({"name": "g", "attention": {"layers": 1, "kv_heads": 1,
                  "head_dim": 8}})");
  write(bad, R"({"name": "g"})");
  write(big, std::string((1 << 20) + 1, ' '));
  absl::StatusOr<KvLayout> layout = ReadKvLayoutFile(good);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->families, KV(16, 1));

  layout = ReadKvLayoutFile(bad);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr(bad + ": KV layout:"));
  layout = ReadKvLayoutFile(big);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("larger than 1048576"));
  layout = ReadKvLayoutFile(dir.Child("missing.json"));
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(layout.status().message(),
              HasSubstr("cannot read KV layout file '" +
                        dir.Child("missing.json") + "'"));
}

// The example layouts the package installs parse.
TEST(KvLayoutTest, ShippedExamplesParse) {
  for (const char* name :
       {"llama-3-8b", "llama-3-70b-tp8", "qwen3-30b-a3b-fp8",
        "custom-families"}) {
    absl::StatusOr<KvLayout> layout = ReadKvLayoutFile(testing::RunfilePath(
        std::string("deploy/kv-layouts/") + name + ".json"));
    ASSERT_TRUE(layout.ok()) << name << ": " << layout.status();
    EXPECT_EQ(layout->name, name);
  }
  absl::StatusOr<KvLayout> tp8 = ReadKvLayoutFile(
      testing::RunfilePath("deploy/kv-layouts/llama-3-70b-tp8.json"));
  ASSERT_TRUE(tp8.ok());
  EXPECT_EQ(tp8->families, KV(256, 80));  // One of 8 heads: 128 * 2 bytes.
}

}  // namespace
}  // namespace hicache
