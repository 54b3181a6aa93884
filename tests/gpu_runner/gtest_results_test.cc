#include "tools/gpu_runner/gtest_results.h"

#include "gtest/gtest.h"

namespace hicache::gpu_runner {
namespace {

// The shape GoogleTest 1.12 writes with --gtest_output=json (trimmed).
constexpr char kReport[] = R"json({
  "tests": 5, "failures": 1, "disabled": 0, "errors": 0,
  "testsuites": [
    {"name": "RealCudaRuntimeTest", "tests": 3, "testsuite": [
      {"name": "Copies", "status": "RUN", "result": "COMPLETED"},
      {"name": "NeedsGpu", "status": "RUN", "result": "SKIPPED",
       "skipped": {"message": "a.cc:3\nno GPU (0 CUDA devices)"}},
      {"name": "Broken", "status": "RUN", "result": "COMPLETED",
       "failures": [{"failure": "a.cc:9\nExpected equality", "type": ""}]}
    ]},
    {"name": "Other", "tests": 2, "testsuite": [
      {"name": "AlsoNeedsGpu", "status": "RUN", "result": "SKIPPED",
       "skipped": {"message": "b.cc:1\nno GPU (0 CUDA devices)"}},
      {"name": "DISABLED_x", "status": "NOTRUN", "result": "SUPPRESSED"}
    ]}
  ]
})json";

TEST(GtestResultsTest, CountsPassedFailedAndSkippedCases) {
  absl::StatusOr<GtestResults> r = ParseGtestJson(kReport);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->passed, 1);
  EXPECT_EQ(r->failed, 1);
  EXPECT_EQ(r->skipped, 3);
  EXPECT_EQ(r->failures, std::vector<std::string>{"RealCudaRuntimeTest.Broken"});
  EXPECT_EQ(r->skip_reasons,
            std::vector<std::string>{"no GPU (0 CUDA devices)"});
  EXPECT_EQ(r->Status(), "fail");
}

TEST(GtestResultsTest, StatusIsPassWhenAnyPassedAndSkipWhenNoneRan) {
  GtestResults r;
  EXPECT_EQ(r.Status(), "skip");
  r.skipped = 4;
  EXPECT_EQ(r.Status(), "skip");
  r.passed = 1;
  EXPECT_EQ(r.Status(), "pass");
}

TEST(GtestResultsTest, ATruncatedOrForeignDocumentIsAnError) {
  EXPECT_FALSE(ParseGtestJson("").ok());
  EXPECT_FALSE(ParseGtestJson(std::string(kReport).substr(0, 100)).ok());
  EXPECT_FALSE(ParseGtestJson(R"({"testsuites": 3})").ok());
  EXPECT_FALSE(ParseGtestJson("[1, 2]").ok());
  // Odd entries inside a valid document are ignored, not fatal.
  absl::StatusOr<GtestResults> r = ParseGtestJson(
      R"({"testsuites": [7, {"name": "S", "testsuite": [1, {"name": "c"}]}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->passed, 1);
}

}  // namespace
}  // namespace hicache::gpu_runner
