// End-to-end: the real hicached's shared-memory segments across SIGKILL,
// restart and SIGTERM (issue 11, item 10), and instance isolation between
// daemons.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/binaries.h"

namespace hicache {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunResult;
using testing::Subprocess;

using testing::CtlPath;
using testing::DaemonPath;

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// Inode of `path`, 0 when it does not exist.
ino_t InodeOf(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

bool Healthy(const std::string& socket) {
  absl::StatusOr<RunResult> r = testing::Run(
      {CtlPath(), "--socket=" + socket, "--timeout=1", "health"});
  return r.ok() && r->exit_code == 0;
}

// The shared-memory files process `pid` maps: path -> inode. Independent of
// how the daemon names its segments.
std::map<std::string, ino_t> MappedShm(pid_t pid) {
  std::map<std::string, ino_t> mapped;
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  while (std::getline(maps, line)) {
    std::vector<std::string> fields =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 6 || fields[5].rfind("/dev/shm/", 0) != 0) continue;
    uint64_t inode = 0;
    if (absl::SimpleAtoi(fields[4], &inode)) mapped[fields[5]] = inode;
  }
  return mapped;
}

// Every /dev/shm entry of instance `id`: its segments and its lock file.
std::vector<std::string> ShmEntriesOf(const std::string& id) {
  std::vector<std::string> entries;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return entries;
  const std::string segment_prefix = "hicache-" + id + "-";
  const std::string lock = "hicache-" + id + ".lock";
  while (const dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name == lock || name.rfind(segment_prefix, 0) == 0) {
      entries.push_back("/dev/shm/" + name);
    }
  }
  closedir(dir);
  return entries;
}

// The instance id the daemon logged at start.
std::string InstanceFromLog(const std::string& log) {
  const std::string marker = "shared-memory instance '";
  const size_t at = log.find(marker);
  if (at == std::string::npos) return "";
  const size_t begin = at + marker.size();
  return log.substr(begin, log.find('\'', begin) - begin);
}

class ShmReclaimTest : public ::testing::Test {
 protected:
  // Starts hicached on `socket` and waits until it is healthy.
  Subprocess StartDaemon(const std::string& socket,
                         std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {DaemonPath(), "--socket=" + socket,
                                     "--cp_size=2",
                                     "--device_pages_per_rank=64",
                                     "--host_pages_per_rank=128"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(argv);
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && daemon->Running()) {
      if (Exists(socket) && Healthy(socket)) return *std::move(daemon);
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "hicached did not become healthy; stderr:\n"
                  << daemon->Stderr();
    return *std::move(daemon);
  }

  static void Kill(Subprocess& daemon) {
    ASSERT_TRUE(daemon.Signal(SIGKILL).ok());
    ASSERT_TRUE(daemon.Wait(absl::Seconds(10)).ok());
  }

  static void Stop(Subprocess& daemon) {
    ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
    absl::StatusOr<int> code = daemon.Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << daemon.Stderr();
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
};

// Reproduction: a SIGKILLed daemon left its segments in /dev/shm at full
// size, and a restart never reclaimed them.
TEST_F(ShmReclaimTest, RestartReclaimsTheSegmentsOfASigkilledDaemon) {
  std::map<std::string, ino_t> leaked;
  std::string id;
  {
    Subprocess victim = StartDaemon(socket_);
    id = InstanceFromLog(victim.Stderr());
    EXPECT_FALSE(id.empty()) << victim.Stderr();
    leaked = MappedShm(victim.pid());
    ASSERT_EQ(leaked.size(), 4u);  // device and host pools of ranks 0 and 1.
    for (const auto& [path, inode] : leaked) {
      EXPECT_THAT(path, ::testing::StartsWith("/dev/shm/hicache-" + id + "-"));
    }
    Kill(victim);
  }
  // The kill left every segment behind, at full size.
  uint64_t leaked_bytes = 0;
  for (const auto& [path, inode] : leaked) {
    ASSERT_EQ(InodeOf(path), inode) << path;
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_GT(st.st_size, 0);
    leaked_bytes += st.st_size;
  }

  Subprocess daemon = StartDaemon(socket_);
  EXPECT_EQ(InstanceFromLog(daemon.Stderr()), id);  // Stable per socket.
  EXPECT_THAT(daemon.Stderr(),
              HasSubstr(absl::StrCat("reclaimed 4 stale shared-memory segments "
                                     "of instance '",
                                     id, "' left by a dead daemon: ",
                                     leaked_bytes, " bytes")));
  // None of the killed daemon's segments is left: where a name is in use
  // again, it is the new daemon's segment (another inode).
  const std::map<std::string, ino_t> now = MappedShm(daemon.pid());
  EXPECT_EQ(now.size(), 4u);
  for (const auto& [path, inode] : leaked) {
    EXPECT_NE(InodeOf(path), inode) << path << " survived the restart";
    ASSERT_TRUE(now.count(path)) << path;
    EXPECT_EQ(InodeOf(path), now.at(path));
  }
  EXPECT_EQ(ShmEntriesOf(id).size(), 5u);  // 4 segments and the lock file.

  // A clean stop leaves nothing of the instance in /dev/shm.
  Stop(daemon);
  EXPECT_THAT(ShmEntriesOf(id), ::testing::IsEmpty());
  EXPECT_THAT(daemon.Stderr(), Not(HasSubstr("left a shared-memory entry")));
}

TEST_F(ShmReclaimTest, DaemonsOnOtherSocketsNeverTouchEachOthersSegments) {
  const std::string socket_b = dir_.Child("b.sock");
  Subprocess b = StartDaemon(socket_b);
  const std::string id_b = InstanceFromLog(b.Stderr());
  const std::map<std::string, ino_t> b_segments = MappedShm(b.pid());
  ASSERT_EQ(b_segments.size(), 4u);

  std::string id_a;
  {
    Subprocess a = StartDaemon(socket_);
    id_a = InstanceFromLog(a.Stderr());
    ASSERT_FALSE(id_a.empty());
    EXPECT_NE(id_a, id_b);
    for (const auto& [path, inode] : MappedShm(a.pid())) {
      EXPECT_EQ(b_segments.count(path), 0u) << path;
    }
    Kill(a);
  }
  Subprocess a = StartDaemon(socket_);
  EXPECT_THAT(a.Stderr(), HasSubstr("reclaimed 4 stale"));
  // B is untouched by A's kill and A's reclaim.
  for (const auto& [path, inode] : b_segments) {
    EXPECT_EQ(InodeOf(path), inode) << path;
  }
  EXPECT_TRUE(Healthy(socket_b));
  EXPECT_EQ(MappedShm(b.pid()), b_segments);

  Stop(a);
  Stop(b);
  EXPECT_THAT(ShmEntriesOf(id_a), ::testing::IsEmpty());
  EXPECT_THAT(ShmEntriesOf(id_b), ::testing::IsEmpty());
}

TEST_F(ShmReclaimTest, AnInstanceServedByALiveDaemonIsRefused) {
  const std::string id = absl::StrCat("itest", getpid());
  Subprocess first = StartDaemon(socket_, {"--instance=" + id});
  EXPECT_EQ(InstanceFromLog(first.Stderr()), id);
  const std::map<std::string, ino_t> segments = MappedShm(first.pid());
  ASSERT_EQ(segments.size(), 4u);

  const std::string other_socket = dir_.Child("other.sock");
  absl::StatusOr<RunResult> second =
      testing::Run({DaemonPath(), "--socket=" + other_socket,
                    "--instance=" + id, "--cp_size=2"});
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->exit_code, 1) << second->err;
  EXPECT_THAT(second->err,
              HasSubstr(absl::StrCat("shared-memory instance '", id,
                                     "' is in use by another process (pid ",
                                     first.pid(), ")")));
  EXPECT_FALSE(Exists(other_socket));
  EXPECT_FALSE(Exists(other_socket + ".lock"));
  // The first daemon's segments are intact and it still serves.
  for (const auto& [path, inode] : segments) {
    EXPECT_EQ(InodeOf(path), inode) << path;
  }
  EXPECT_TRUE(Healthy(socket_));
  Stop(first);
  EXPECT_THAT(ShmEntriesOf(id), ::testing::IsEmpty());
}

TEST_F(ShmReclaimTest, AnInvalidInstanceFlagIsABadConfiguration) {
  for (const char* bad : {"a/b", "9lives", "../../etc/x"}) {
    absl::StatusOr<RunResult> r = testing::Run(
        {DaemonPath(), "--socket=" + socket_, absl::StrCat("--instance=", bad)});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 2) << bad << "\n" << r->err;
    EXPECT_THAT(r->err, HasSubstr("instance must be 1 to 64 characters"));
    EXPECT_FALSE(Exists(socket_));
  }
}

}  // namespace
}  // namespace hicache
