// ShmFreeBytes, InstanceShmBytes (which segments are the instance's own)
// and the capacity verdict, including the hot-restart case it exists for: a
// kept host tier fills the /dev/shm it was sized for.
#include "daemon/pool/shm_capacity.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using ::hicache::testing::TempDir;
using ::testing::HasSubstr;

// Writes `bytes` of data (allocated, not sparse) and returns the allocated
// size as stat reports it.
uint64_t WriteFile(const std::string& path, size_t bytes) {
  const int fd = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  EXPECT_GE(fd, 0) << path;
  const std::string data(bytes, 'x');
  EXPECT_EQ(write(fd, data.data(), data.size()),
            static_cast<ssize_t>(data.size()));
  EXPECT_EQ(fsync(fd), 0);
  close(fd);
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST(ShmCapacityTest, InstanceShmBytesCountsOnlyTheInstancesPoolSegments) {
  TempDir dir;
  uint64_t mine = 0;
  mine += WriteFile(dir.Child("hicache-a-host-r0-g00112233aabbccdd"), 65536);
  mine += WriteFile(dir.Child("hicache-a-keys-r0-g00112233aabbccdd"), 16384);
  mine += WriteFile(dir.Child("hicache-a-device-r1"), 8192);
  mine += WriteFile(dir.Child("hicache-a-host-r12"), 4096);
  // Not instance a's: another instance whose name starts with "a-" or
  // "ab", the lock file, other kinds and names, a sparse file's holes.
  WriteFile(dir.Child("hicache-a-b-host-r0"), 32768);
  WriteFile(dir.Child("hicache-ab-host-r0"), 32768);
  WriteFile(dir.Child("hicache-a.lock"), 4096);
  WriteFile(dir.Child("hicache-a-host-rx"), 4096);
  WriteFile(dir.Child("hicache-a-events-r0"), 4096);
  WriteFile(dir.Child("other"), 4096);
  ASSERT_EQ(mkdir(dir.Child("hicache-a-host-r7").c_str(), 0700), 0);
  ASSERT_GT(mine, 0u);
  EXPECT_EQ(InstanceShmBytes(dir.path(), "/hicache-a"), mine);
  EXPECT_EQ(InstanceShmBytes(dir.path(), "hicache-a"), mine);  // No '/'.
  EXPECT_EQ(InstanceShmBytes(dir.path(), "/hicache-a-b"),
            InstanceShmBytes(dir.path(), "/hicache-ab"));
  EXPECT_GT(InstanceShmBytes(dir.path(), "/hicache-a-b"), 0u);
  EXPECT_EQ(InstanceShmBytes(dir.path(), "/hicache-z"), 0u);
  EXPECT_EQ(InstanceShmBytes(dir.path(), ""), 0u);
  EXPECT_EQ(InstanceShmBytes(dir.Child("missing"), "/hicache-a"), 0u);

  // A sparse segment counts what it holds, not its size.
  const std::string sparse = dir.Child("hicache-s-host-r0");
  const int fd = open(sparse.c_str(), O_CREAT | O_WRONLY, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 30), 0);
  close(fd);
  EXPECT_LT(InstanceShmBytes(dir.path(), "/hicache-s"), 1u << 20);
}

TEST(ShmCapacityTest, VerdictCountsTheInstancesOwnSegmentsAsReusable) {
  constexpr uint64_t kGiB = 1ull << 30;
  EXPECT_TRUE(ShmCapacityVerdict(40 * kGiB, 64 * kGiB, 0, "/dev/shm").ok());
  // The hot restart this is for: /dev/shm sized 64 GiB for a 40 GiB host
  // tier, which the previous daemon kept there (24 GiB free). Reattaching
  // needs no new space.
  EXPECT_TRUE(
      ShmCapacityVerdict(40 * kGiB, 24 * kGiB, 40 * kGiB, "/dev/shm").ok());
  EXPECT_TRUE(ShmCapacityVerdict(40 * kGiB, 30 * kGiB, 10 * kGiB, "/x").ok());
  const absl::Status short_of =
      ShmCapacityVerdict(40 * kGiB, 24 * kGiB, 8 * kGiB, "/dev/shm");
  EXPECT_EQ(short_of.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(short_of.message(), HasSubstr("need 42949672960 bytes (40.00 GiB)"));
  EXPECT_THAT(short_of.message(), HasSubstr("24.00 GiB) free"));
  EXPECT_THAT(short_of.message(),
              HasSubstr("8.00 GiB, that this instance's old segments hold"));
  EXPECT_THAT(short_of.message(), HasSubstr("mount -o remount,size="));
  const absl::Status without =
      ShmCapacityVerdict(40 * kGiB, 24 * kGiB, 0, "/dev/shm");
  EXPECT_FALSE(without.ok());
  EXPECT_THAT(without.message(), ::testing::Not(HasSubstr("old segments")));
}

TEST(ShmCapacityTest, CheckShmCapacityReadsTheDirectory) {
  TempDir dir;
  const uint64_t mine = WriteFile(dir.Child("hicache-a-host-r0"), 65536);
  EXPECT_TRUE(CheckShmCapacity(0, dir.path(), "/hicache-a").ok());
  const absl::Status huge =
      CheckShmCapacity(UINT64_MAX / 2, dir.path(), "/hicache-a");
  EXPECT_EQ(huge.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(huge.message(),
              HasSubstr(std::to_string(mine) + " bytes, "));
  EXPECT_EQ(CheckShmCapacity(1, dir.Child("missing")).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ShmFreeBytes(dir.path()).ok());
}

}  // namespace
}  // namespace hicache
