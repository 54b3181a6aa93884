#include "daemon/pool/shm_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;

std::string UniqueName(const char* tag) {
  static int counter = 0;
  return absl::StrCat("/hicache-test-", getpid(), "-", tag, "-", counter++);
}

bool SegmentExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmPoolTest, CreatesAGroupSharedSegmentAndRemovesIt) {
  const std::string name = UniqueName("a");
  {
    auto pool = ShmPool::Create(name, 1 << 20, false);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ((*pool)->size_bytes(), 1u << 20);
    EXPECT_EQ((*pool)->Export().handle, name);
    EXPECT_EQ((*pool)->Export().kind, PoolExport::Kind::kSharedMemory);
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    ASSERT_GE(fd, 0);
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    // docs/security.md: the daemon's user and group map the pools.
    EXPECT_EQ(st.st_mode & 07777, 0660u);
    EXPECT_EQ(st.st_uid, geteuid());
    EXPECT_EQ(st.st_gid, getegid());
    EXPECT_EQ(st.st_size, 1 << 20);
    close(fd);
  }
  EXPECT_FALSE(SegmentExists(name));
}

// The umask applies to shm_open; a daemon started with umask 0077 (or 0022)
// must still export 0660 segments, and a restrictive umask must not leak a
// wider mode either.
TEST(ShmPoolTest, ModeIsExactly0660WhateverTheUmask) {
  for (const mode_t mask : {mode_t{0077}, mode_t{0022}, mode_t{0}}) {
    const mode_t old = umask(mask);
    const std::string name = UniqueName("umask");
    auto pool = ShmPool::Create(name, 4096, false);
    umask(old);
    ASSERT_TRUE(pool.ok()) << pool.status();
    struct stat st {};
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fstat(fd, &st), 0);
    close(fd);
    EXPECT_EQ(st.st_mode & 07777, kShmPoolMode) << "umask " << mask;
    EXPECT_EQ(st.st_gid, getegid()) << "umask " << mask;
  }
}

// ShareSegmentWithGroup works on any open file the caller owns: the mode is
// reset even from a wider one (0666 -> 0660).
TEST(ShmPoolTest, ShareSegmentWithGroupNarrowsAWiderMode) {
  const std::string name = UniqueName("wide");
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0666), 0);
  EXPECT_TRUE(ShareSegmentWithGroup(fd, name).ok());
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, getegid());
  close(fd);
  shm_unlink(name.c_str());
}

TEST(ShmPoolTest, ShareSegmentWithGroupReportsABadDescriptor) {
  const absl::Status status = ShareSegmentWithGroup(-1, "/none");
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(), HasSubstr("/none"));
}

TEST(ShmPoolTest, AnotherProcessSeesTheSameBytes) {
  const std::string name = UniqueName("b");
  auto pool = ShmPool::Create(name, 4096, false);
  ASSERT_TRUE(pool.ok());
  std::memset((*pool)->host_data(), 0, 4096);
  const pid_t child = fork();
  if (child == 0) {
    // A "model worker": maps the pool by its exported name and writes KV.
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) _exit(1);
    void* data = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) _exit(2);
    std::memcpy(static_cast<char*>(data) + 100, "kv-bytes", 8);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(std::memcmp(static_cast<char*>((*pool)->host_data()) + 100,
                        "kv-bytes", 8),
            0);
}

TEST(ShmPoolTest, RejectsBadInput) {
  EXPECT_THAT(ShmPool::Create("noslash", 10, false).status().message(),
              HasSubstr("must be '/'"));
  EXPECT_FALSE(ShmPool::Create("/a/b", 10, false).ok());
  EXPECT_THAT(ShmPool::Create(UniqueName("c"), 0, false).status().message(),
              HasSubstr("positive size"));
  const std::string name = UniqueName("d");
  auto first = ShmPool::Create(name, 10, false);
  ASSERT_TRUE(first.ok());
  auto second = ShmPool::Create(name, 10, false);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(SegmentExists(name));  // The failed create did not remove it.
}

TEST(ShmPoolTest, LockedHostPool) {
  auto pool = ShmPool::Create(UniqueName("e"), 64 << 10, true);
  if (!pool.ok() &&
      pool.status().code() == absl::StatusCode::kResourceExhausted) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK too small here: " << pool.status();
  }
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE((*pool)->locked());
}

TEST(ShmPoolBackendTest, NamesPoolsByKindAndRank) {
  ShmPoolBackend backend(UniqueName("backend"));
  auto device = backend.CreateDevicePool(3, 128);
  auto host = backend.CreateHostPool(3, 256, false);
  ASSERT_TRUE(device.ok() && host.ok());
  EXPECT_THAT((*device)->name(), HasSubstr("-device-r3"));
  EXPECT_THAT((*host)->name(), HasSubstr("-host-r3"));
  EXPECT_EQ((*host)->size_bytes(), 256u);
}

}  // namespace
}  // namespace hicache
