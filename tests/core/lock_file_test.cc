#include "daemon/core/lock_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(LockFileTest, WritesPidAndRemovesTheFileOnRelease) {
  testing::TempDir dir;
  const std::string path = dir.Child("x.lock");
  {
    auto lock = LockFile::Acquire(path);
    ASSERT_TRUE(lock.ok()) << lock.status();
    EXPECT_EQ(ReadAll(path), absl::StrCat(getpid(), "\n"));
    struct stat st {};
    ASSERT_EQ(lstat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
  }
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(LockFile::Acquire(path).ok());
}

TEST(LockFileTest, SecondHolderIsRefusedWithTheFirstsPid) {
  testing::TempDir dir;
  const std::string path = dir.Child("x.lock");
  auto first = LockFile::Acquire(path);
  ASSERT_TRUE(first.ok());
  std::string holder = "stale";
  auto second = LockFile::Acquire(path, &holder);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(holder, absl::StrCat(getpid()));
  EXPECT_THAT(second.status().message(), HasSubstr(path));
  EXPECT_TRUE(Exists(path));  // The refused attempt removed nothing.
}

TEST(LockFileTest, ReusesTheFileOfADeadHolder) {
  testing::TempDir dir;
  const std::string path = dir.Child("x.lock");
  std::ofstream(path) << "999999999\n";  // Nobody holds the flock.
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  auto lock = LockFile::Acquire(path);
  ASSERT_TRUE(lock.ok()) << lock.status();
  EXPECT_EQ(ReadAll(path), absl::StrCat(getpid(), "\n"));
}

// Reproduction (issue 11, item 11): a symlink planted at the lock path made
// the daemon overwrite its target.
TEST(LockFileTest, RefusesASymlinkAndLeavesItsTargetUnchanged) {
  testing::TempDir dir;
  const std::string target = dir.Child("precious");
  std::ofstream(target) << "do not overwrite";
  const std::string path = dir.Child("x.lock");
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  std::string holder;
  auto lock = LockFile::Acquire(path, &holder);
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), HasSubstr(path));
  EXPECT_THAT(lock.status().message(), HasSubstr("symbolic link"));
  EXPECT_TRUE(holder.empty());
  EXPECT_EQ(ReadAll(target), "do not overwrite");
  EXPECT_TRUE(Exists(path));  // Left for the operator to look at.
}

TEST(LockFileTest, RefusesADanglingSymlinkWithoutCreatingItsTarget) {
  testing::TempDir dir;
  const std::string target = dir.Child("created-by-attacker-choice");
  const std::string path = dir.Child("x.lock");
  ASSERT_EQ(symlink(target.c_str(), path.c_str()), 0);
  auto lock = LockFile::Acquire(path);
  ASSERT_FALSE(lock.ok());
  EXPECT_THAT(lock.status().message(), HasSubstr("symbolic link"));
  EXPECT_FALSE(Exists(target));
}

TEST(LockFileTest, RefusesAHardLinkToAnotherFile) {
  testing::TempDir dir;
  const std::string target = dir.Child("precious");
  std::ofstream(target) << "do not overwrite";
  const std::string path = dir.Child("x.lock");
  ASSERT_EQ(link(target.c_str(), path.c_str()), 0);
  auto lock = LockFile::Acquire(path);
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), HasSubstr("2 links"));
  EXPECT_EQ(ReadAll(target), "do not overwrite");
}

TEST(LockFileTest, RefusesADirectoryAndAFifo) {
  testing::TempDir dir;
  const std::string directory = dir.Child("d.lock");
  ASSERT_EQ(mkdir(directory.c_str(), 0700), 0);
  EXPECT_THAT(LockFile::Acquire(directory).status().message(),
              HasSubstr("not a regular file"));
  const std::string fifo = dir.Child("f.lock");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(LockFile::Acquire(fifo).status().message(),
              HasSubstr("not a regular file"));
  EXPECT_TRUE(Exists(directory));
  EXPECT_TRUE(Exists(fifo));
}

// Root would pass any permission check; the ownership check refuses it too.
TEST(LockFileTest, RefusesAFileOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a file away";
  testing::TempDir dir;
  const std::string path = dir.Child("x.lock");
  std::ofstream(path) << "planted";
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  auto lock = LockFile::Acquire(path);
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lock.status().message(), HasSubstr("owned by uid 65534"));
  EXPECT_THAT(lock.status().message(), HasSubstr(path));
  EXPECT_EQ(ReadAll(path), "planted");
}

TEST(LockFileTest, ReleaseLeavesAFileThatReplacedOursAlone) {
  testing::TempDir dir;
  const std::string path = dir.Child("x.lock");
  {
    auto lock = LockFile::Acquire(path);
    ASSERT_TRUE(lock.ok());
    ASSERT_EQ(unlink(path.c_str()), 0);
    std::ofstream(path) << "someone else's";
  }
  EXPECT_EQ(ReadAll(path), "someone else's");
}

}  // namespace
}  // namespace hicache
