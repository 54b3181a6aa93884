#include "daemon/pool/shm_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
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

// --- Persistent host segments (hot restart) ---

void WritePattern(void* data, size_t size, uint8_t seed) {
  auto* bytes = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + seed);
}

bool HasPattern(const void* data, size_t size, uint8_t seed) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) {
    if (bytes[i] != static_cast<uint8_t>(i * 7 + seed)) return false;
  }
  return true;
}

// Unlinks a segment when the test ends, pass or fail.
struct Unlinker {
  std::string name;
  ~Unlinker() { shm_unlink(name.c_str()); }
};

TEST(ShmPoolPersistTest, PersistentHostNameCarriesTheFingerprint) {
  EXPECT_EQ(ShmPool::PersistentHostName("/hicache-a", 3, 0xab),
            "/hicache-a-host-r3-g00000000000000ab");
  EXPECT_EQ(ShmPool::PersistentHostName("/hicache-x", 0, ~uint64_t{0}),
            "/hicache-x-host-r0-gffffffffffffffff");
}

TEST(ShmPoolPersistTest, KeptSegmentIsAttachedWithItsBytes) {
  const std::string name = UniqueName("keep");
  Unlinker cleanup{name};
  {
    auto pool = ShmPool::Create(name, 8192, false);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_FALSE((*pool)->attached());
    EXPECT_FALSE((*pool)->kept());
    WritePattern((*pool)->host_data(), 8192, 1);
    (*pool)->Keep();
    EXPECT_TRUE((*pool)->kept());
  }
  ASSERT_TRUE(SegmentExists(name));
  // Creating never clobbers a kept segment.
  EXPECT_EQ(ShmPool::Create(name, 8192, false).status().code(),
            absl::StatusCode::kAlreadyExists);
  {
    auto pool = ShmPool::Attach(name, 8192, false);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_TRUE((*pool)->attached());
    EXPECT_EQ((*pool)->name(), name);
    EXPECT_EQ((*pool)->Export().handle, name);
    EXPECT_TRUE(HasPattern((*pool)->host_data(), 8192, 1));
    WritePattern((*pool)->host_data(), 8192, 2);
    (*pool)->Keep();
  }
  {
    auto pool = ShmPool::Attach(name, 8192, false);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_TRUE(HasPattern((*pool)->host_data(), 8192, 2));
    // Not kept this time: unlinked on destruction like a created pool.
  }
  EXPECT_FALSE(SegmentExists(name));
  EXPECT_EQ(ShmPool::Attach(name, 8192, false).status().code(),
            absl::StatusCode::kNotFound);
}

// The crash case: the owner dies without running a destructor; a new owner
// attaches the segment and finds what was written before the kill.
TEST(ShmPoolPersistTest, SurvivesAKilledOwner) {
  const std::string name =
      ShmPool::PersistentHostName(UniqueName("killed"), 0, 0x1234);
  Unlinker cleanup{name};
  const pid_t child = fork();
  if (child == 0) {
    auto pool = ShmPool::Create(name, 1 << 16, false);
    if (!pool.ok()) _exit(1);
    WritePattern((*pool)->host_data(), 1 << 16, 9);
    raise(SIGKILL);
    _exit(2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited " << WEXITSTATUS(status);
  ASSERT_EQ(WTERMSIG(status), SIGKILL);
  auto pool = ShmPool::Attach(name, 1 << 16, false);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE(HasPattern((*pool)->host_data(), 1 << 16, 9));
}

TEST(ShmPoolPersistTest, AttachRefusesASizeMismatchAndLeavesTheSegment) {
  const std::string name = UniqueName("size");
  Unlinker cleanup{name};
  {
    auto pool = ShmPool::Create(name, 4096, false);
    ASSERT_TRUE(pool.ok());
    WritePattern((*pool)->host_data(), 4096, 3);
    (*pool)->Keep();
  }
  for (const uint64_t size : {uint64_t{8192}, uint64_t{4095}, uint64_t{1}}) {
    auto wrong = ShmPool::Attach(name, size, false);
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(wrong.status().message(), HasSubstr("has 4096 bytes"));
  }
  ASSERT_TRUE(SegmentExists(name));
  auto right = ShmPool::Attach(name, 4096, false);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_TRUE(HasPattern((*right)->host_data(), 4096, 3));
}

TEST(ShmPoolPersistTest, AttachRefusesBadInput) {
  EXPECT_EQ(ShmPool::Attach("noslash", 10, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmPool::Attach("/a/b", 10, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmPool::Attach(UniqueName("zero"), 0, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmPool::Attach(UniqueName("none"), 10, false).status().code(),
            absl::StatusCode::kNotFound);
}

// A segment whose mode was widened (or narrowed) since it was created may
// hold someone else's bytes: refused, and left in place.
TEST(ShmPoolPersistTest, AttachRefusesAChangedMode) {
  for (const mode_t mode : {mode_t{0666}, mode_t{0664}, mode_t{0600}}) {
    const std::string name = UniqueName("mode");
    Unlinker cleanup{name};
    {
      auto pool = ShmPool::Create(name, 4096, false);
      ASSERT_TRUE(pool.ok());
      (*pool)->Keep();
    }
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchmod(fd, mode), 0);
    close(fd);
    auto refused = ShmPool::Attach(name, 4096, false);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
        << "mode " << mode;
    EXPECT_THAT(refused.status().message(), HasSubstr("access was changed"));
    EXPECT_TRUE(SegmentExists(name));
  }
}

TEST(ShmPoolPersistTest, AttachRefusesLinksAndDirectories) {
  const std::string target = UniqueName("target");
  Unlinker cleanup{target};
  {
    auto pool = ShmPool::Create(target, 4096, false);
    ASSERT_TRUE(pool.ok());
    (*pool)->Keep();
  }
  const std::string link = UniqueName("link");
  const std::string link_path = absl::StrCat("/dev/shm", link);
  ASSERT_EQ(symlink(absl::StrCat("/dev/shm", target).c_str(),
                    link_path.c_str()),
            0);
  auto via_link = ShmPool::Attach(link, 4096, false);
  unlink(link_path.c_str());
  EXPECT_EQ(via_link.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(via_link.status().message(), HasSubstr("not a regular file"));

  const std::string dir = UniqueName("dir");
  const std::string dir_path = absl::StrCat("/dev/shm", dir);
  ASSERT_EQ(mkdir(dir_path.c_str(), 0700), 0);
  auto via_dir = ShmPool::Attach(dir, 4096, false);
  rmdir(dir_path.c_str());
  EXPECT_EQ(via_dir.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(via_dir.status().message(), HasSubstr("not a regular file"));
  EXPECT_TRUE(SegmentExists(target));
}

// Another owner's segment, or one given to another group, is refused. Only
// root can give a segment away, so elsewhere this test is skipped.
TEST(ShmPoolPersistTest, AttachRefusesAnotherOwnerOrGroup) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to chown a segment to another user";
  }
  const uid_t other_uid = 65534;  // nobody
  const gid_t other_gid = 65534;  // nogroup
  for (const bool change_user : {true, false}) {
    const std::string name = UniqueName("owner");
    Unlinker cleanup{name};
    {
      auto pool = ShmPool::Create(name, 4096, false);
      ASSERT_TRUE(pool.ok());
      (*pool)->Keep();
    }
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchown(fd, change_user ? other_uid : static_cast<uid_t>(-1),
                     change_user ? static_cast<gid_t>(-1) : other_gid),
              0);
    // chown clears nothing relevant, but keep the mode exactly 0660.
    ASSERT_EQ(fchmod(fd, kShmPoolMode), 0);
    close(fd);
    auto refused = ShmPool::Attach(name, 4096, false);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(),
                HasSubstr(change_user ? "owned by uid 65534" : "group 65534"));
    EXPECT_TRUE(SegmentExists(name));
  }
}

}  // namespace
}  // namespace hicache
