#include "daemon/core/build_info.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::MatchesRegex;

TEST(BuildInfoTest, VersionIsSemantic) {
  EXPECT_THAT(GetBuildInfo().version,
              MatchesRegex("[0-9]+\\.[0-9]+\\.[0-9]+.*"));
}

TEST(BuildInfoTest, CompilerAndModeAreNamed) {
  const BuildInfo& info = GetBuildInfo();
  EXPECT_THAT(info.compiler,
              MatchesRegex("(gcc|clang) [0-9]+\\.[0-9]+\\.[0-9]+"));
#ifdef NDEBUG
  EXPECT_THAT(info.build_mode, MatchesRegex("opt.*"));
#else
  EXPECT_THAT(info.build_mode, MatchesRegex("debug.*"));
#endif
}

// Tests do not link //version:stamped: only hicached and hicachectl carry the
// revision (tests/integration/daemon_process_test checks theirs).
TEST(BuildInfoTest, RevisionIsUnstampedOutsideTheReleasedBinaries) {
  EXPECT_EQ(GetBuildInfo().git_revision, "unstamped");
}

TEST(BuildInfoTest, SameObjectEveryTime) {
  EXPECT_EQ(&GetBuildInfo(), &GetBuildInfo());
}

}  // namespace
}  // namespace hicache
