// Every shared-memory segment the daemon exports, on both backends, is mode
// 0660 with the daemon's effective group, whatever the umask
// (docs/security.md, "Who can map the pools"): the CPU backend's pools
// (ShmPoolBackend) and the simulated CUDA runtime's device memory, which
// workers map through IPC handles.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/backend/cuda/sim_cuda_runtime.h"
#include "daemon/pool/shm_pool.h"
#include "gtest/gtest.h"

namespace hicache {
namespace {

// The /dev/shm entries whose names start with `prefix` (no leading '/').
std::vector<std::string> SegmentsWithPrefix(const std::string& prefix) {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, prefix)) {
      names.push_back(absl::StrCat("/dev/shm/", entry->d_name));
    }
  }
  closedir(dir);
  return names;
}

void ExpectGroupShared(const std::string& path) {
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
  EXPECT_EQ(st.st_mode & 07777, 0660u) << path;
  EXPECT_EQ(st.st_uid, geteuid()) << path;
  EXPECT_EQ(st.st_gid, getegid()) << path;
}

class RestrictiveUmask : public ::testing::Test {
 protected:
  void SetUp() override { old_ = umask(0077); }
  void TearDown() override { umask(old_); }

 private:
  mode_t old_ = 0;
};

TEST_F(RestrictiveUmask, CpuBackendPoolsAreGroupShared) {
  const std::string prefix = absl::StrCat("hicache-modes-", getpid());
  ShmPoolBackend backend(absl::StrCat("/", prefix));
  auto device = backend.CreateDevicePool(0, 1 << 16);
  ASSERT_TRUE(device.ok()) << device.status();
  auto host = backend.CreateHostPool(0, 1 << 16, /*lock_memory=*/false);
  ASSERT_TRUE(host.ok()) << host.status();
  const std::vector<std::string> segments = SegmentsWithPrefix(prefix);
  ASSERT_EQ(segments.size(), 2u);
  for (const std::string& path : segments) ExpectGroupShared(path);
}

TEST_F(RestrictiveUmask, SimulatedDeviceMemoryIsGroupShared) {
  const std::string prefix = absl::StrCat("hicache-sim-", getpid(), "-");
  const size_t before = SegmentsWithPrefix(prefix).size();
  cuda::SimCudaRuntime runtime;
  auto ptr = runtime.DeviceMalloc(0, 1 << 16);
  ASSERT_TRUE(ptr.ok()) << ptr.status();
  const std::vector<std::string> segments = SegmentsWithPrefix(prefix);
  ASSERT_EQ(segments.size(), before + 1);
  for (const std::string& path : segments) ExpectGroupShared(path);
  ASSERT_TRUE(runtime.DeviceFree(0, *ptr).ok());
  EXPECT_EQ(SegmentsWithPrefix(prefix).size(), before);
}

}  // namespace
}  // namespace hicache
