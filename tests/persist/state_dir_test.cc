#include "daemon/persist/state_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache::persist {
namespace {

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(StateDirTest, CreatesTheDirectory0700) {
  hicache::testing::TempDir tmp;
  const std::string dir = tmp.Child("state");
  ASSERT_TRUE(PrepareStateDir(dir).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
  // Idempotent.
  ASSERT_TRUE(PrepareStateDir(dir).ok());
  EXPECT_EQ(JournalPath(dir), dir + "/journal");
  EXPECT_EQ(JournalTmpPath(dir), dir + "/journal.tmp");
}

TEST(StateDirTest, TightensAnExistingDirectory) {
  hicache::testing::TempDir tmp;
  const std::string dir = tmp.Child("state");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  ASSERT_TRUE(PrepareStateDir(dir).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
}

TEST(StateDirTest, RefusesWhatIsNotADirectory) {
  hicache::testing::TempDir tmp;
  const std::string file = tmp.Child("file");
  const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ::close(fd);
  absl::Status s = PrepareStateDir(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("not a directory"), std::string::npos) << s;
  // A missing parent is not created.
  s = PrepareStateDir(tmp.Child("missing/state"));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PrepareStateDir("").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hicache::persist
