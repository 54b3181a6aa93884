#include "daemon/pool/shm_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

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

TEST(ShmPoolTest, CreatesAPrivateSegmentAndRemovesIt) {
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
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(st.st_uid, getuid());
    EXPECT_EQ(st.st_size, 1 << 20);
    close(fd);
  }
  EXPECT_FALSE(SegmentExists(name));
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
