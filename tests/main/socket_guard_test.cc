#include "daemon/main/socket_guard.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
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

// Binds a unix socket at `path`; listens when `listen_too`. Returns the fd.
int BindSocket(const std::string& path, bool listen_too) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (listen_too) {
    EXPECT_EQ(listen(fd, 4), 0);
  }
  return fd;
}

TEST(SocketGuardTest, AcquireFreshPathAndCleanUp) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  {
    auto guard = SocketGuard::Acquire(path);
    ASSERT_TRUE(guard.ok()) << guard.status();
    EXPECT_FALSE((*guard)->removed_stale_socket());
    EXPECT_TRUE(Exists(path + ".lock"));
    std::ifstream lock(path + ".lock");
    int pid = 0;
    lock >> pid;
    EXPECT_EQ(pid, getpid());
    close(BindSocket(path, false));  // Stands in for the gRPC server.
  }
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".lock"));
}

TEST(SocketGuardTest, SecondOwnerIsRefusedWithOwnerPid) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  auto first = SocketGuard::Acquire(path);
  ASSERT_TRUE(first.ok());
  auto second = SocketGuard::Acquire(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("pid ", getpid())));
  EXPECT_THAT(second.status().message(), HasSubstr("already serving"));
}

TEST(SocketGuardTest, ReacquireAfterRelease) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  { ASSERT_TRUE(SocketGuard::Acquire(path).ok()); }
  EXPECT_TRUE(SocketGuard::Acquire(path).ok());
}

TEST(SocketGuardTest, RemovesStaleSocket) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  close(BindSocket(path, false));  // Bound, nobody listens: a dead daemon.
  ASSERT_TRUE(Exists(path));
  auto guard = SocketGuard::Acquire(path);
  ASSERT_TRUE(guard.ok()) << guard.status();
  EXPECT_TRUE((*guard)->removed_stale_socket());
  EXPECT_FALSE(Exists(path));
}

TEST(SocketGuardTest, RefusesLiveListenerWithoutLock) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  const int fd = BindSocket(path, true);
  auto guard = SocketGuard::Acquire(path);
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(guard.status().message(), HasSubstr("already listening"));
  EXPECT_TRUE(Exists(path));             // Not removed.
  EXPECT_FALSE(Exists(path + ".lock"));  // Lock released on failure.
  close(fd);
}

TEST(SocketGuardTest, NeverDeletesARegularFile) {
  testing::TempDir dir;
  const std::string path = dir.Child("important.txt");
  std::ofstream(path) << "data";
  auto guard = SocketGuard::Acquire(path);
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(guard.status().message(), HasSubstr("not a socket"));
  EXPECT_TRUE(Exists(path));
}

TEST(SocketGuardTest, RejectsBadPaths) {
  EXPECT_EQ(SocketGuard::Acquire("").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string too_long = "/tmp/" + std::string(200, 'x');
  auto guard = SocketGuard::Acquire(too_long);
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(guard.status().message(), HasSubstr("shorter than"));
  auto missing = SocketGuard::Acquire("/nonexistent-dir-hicache/x.sock");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("does not exist"));
}

TEST(SocketGuardTest, SetSocketMode) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  auto guard = SocketGuard::Acquire(path);
  ASSERT_TRUE(guard.ok());
  close(BindSocket(path, false));
  ASSERT_TRUE((*guard)->SetSocketMode(0660).ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Reproduction (issue 11, item 11): in a world-writable directory, a symlink
// planted at <socket>.lock made the daemon overwrite its target with its pid.
TEST(SocketGuardTest, RefusesASymlinkedLockFileAndLeavesTheTargetUnchanged) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  const std::string target = dir.Child("precious");
  std::ofstream(target) << "do not overwrite";
  ASSERT_EQ(symlink(target.c_str(), (path + ".lock").c_str()), 0);
  auto guard = SocketGuard::Acquire(path);
  ASSERT_FALSE(guard.ok());
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(guard.status().message(), HasSubstr(path + ".lock"));
  EXPECT_THAT(guard.status().message(), HasSubstr("symbolic link"));
  EXPECT_EQ(ReadAll(target), "do not overwrite");
  EXPECT_TRUE(Exists(path + ".lock"));  // Left for the operator.
  EXPECT_FALSE(Exists(path));
}

TEST(SocketGuardTest, RefusesAHardLinkedLockFile) {
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  const std::string target = dir.Child("precious");
  std::ofstream(target) << "do not overwrite";
  ASSERT_EQ(link(target.c_str(), (path + ".lock").c_str()), 0);
  auto guard = SocketGuard::Acquire(path);
  ASSERT_FALSE(guard.ok());
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(guard.status().message(), HasSubstr(path + ".lock"));
  EXPECT_EQ(ReadAll(target), "do not overwrite");
}

// Root passes every permission check, so ownership is checked explicitly.
TEST(SocketGuardTest, RefusesALockFileOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown a file away";
  testing::TempDir dir;
  const std::string path = dir.Child("d.sock");
  std::ofstream(path + ".lock") << "planted";
  ASSERT_EQ(chown((path + ".lock").c_str(), 65534, 65534), 0);
  auto guard = SocketGuard::Acquire(path);
  ASSERT_FALSE(guard.ok());
  EXPECT_EQ(guard.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(guard.status().message(), HasSubstr(path + ".lock"));
  EXPECT_THAT(guard.status().message(), HasSubstr("owned by uid 65534"));
  EXPECT_EQ(ReadAll(path + ".lock"), "planted");
}

// A symlink at the socket path is never followed or removed, even when it
// points at a stale socket.
TEST(SocketGuardTest, NeverFollowsOrRemovesASymlinkAtTheSocketPath) {
  testing::TempDir dir;
  const std::string stale = dir.Child("stale.sock");
  close(BindSocket(stale, false));
  const std::string path = dir.Child("d.sock");
  ASSERT_EQ(symlink(stale.c_str(), path.c_str()), 0);
  auto guard = SocketGuard::Acquire(path);
  ASSERT_FALSE(guard.ok());
  EXPECT_THAT(guard.status().message(), HasSubstr("not a socket"));
  EXPECT_TRUE(Exists(path));
  EXPECT_TRUE(Exists(stale));
  EXPECT_FALSE(Exists(path + ".lock"));
}

}  // namespace
}  // namespace hicache
