#include "client/cpp/endpoint.h"

#include <grp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace hicache::client {
namespace {

using ::testing::HasSubstr;

class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = getenv("XDG_RUNTIME_DIR");
    had_ = old != nullptr;
    if (had_) saved_ = old;
  }
  void TearDown() override {
    if (had_) {
      setenv("XDG_RUNTIME_DIR", saved_.c_str(), 1);
    } else {
      unsetenv("XDG_RUNTIME_DIR");
    }
  }
  bool had_ = false;
  std::string saved_;
};

TEST_F(EndpointTest, UsesXdgRuntimeDir) {
  setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
  EXPECT_EQ(DefaultSocketPath(), "/run/user/1000/hicached.sock");
}

TEST_F(EndpointTest, FallsBackToTmp) {
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DefaultSocketPath(), "/tmp/hicached.sock");
  setenv("XDG_RUNTIME_DIR", "", 1);
  EXPECT_EQ(DefaultSocketPath(), "/tmp/hicached.sock");
}

TEST_F(EndpointTest, UnixTarget) {
  EXPECT_EQ(UnixTarget("/tmp/a.sock"), "unix:/tmp/a.sock");
  EXPECT_EQ(SocketPathOf("unix:/tmp/a.sock"), "/tmp/a.sock");
  EXPECT_EQ(SocketPathOf("unix:///tmp/a.sock"), "/tmp/a.sock");
  EXPECT_EQ(SocketPathOf("localhost:7000"), "");
}

// One resolution order for every client: flags, then HICACHE_TARGET, then
// HICACHE_SOCKET, then the packaged socket if it exists, then the default.
class ResolveEndpointTest : public EndpointTest {
 protected:
  void SetUp() override {
    EndpointTest::SetUp();
    for (const char* name : {"HICACHE_TARGET", "HICACHE_SOCKET"}) {
      const char* old = getenv(name);
      if (old != nullptr) saved_env_.emplace_back(name, old);
      unsetenv(name);
    }
    setenv("XDG_RUNTIME_DIR", "/run/user/7", 1);
    char dir[] = "/tmp/endpoint_testXXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    packaged_ = dir_ + "/hicached.sock";
  }
  void TearDown() override {
    unsetenv("HICACHE_TARGET");
    unsetenv("HICACHE_SOCKET");
    for (const auto& [name, value] : saved_env_) {
      setenv(name.c_str(), value.c_str(), 1);
    }
    unlink(packaged_.c_str());
    rmdir(dir_.c_str());
    EndpointTest::TearDown();
  }
  // A unix socket bound at `path` (nobody listens); *fd to close.
  static void BindSocket(const std::string& path, int* fd) {
    *fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(*fd, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ASSERT_EQ(bind(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  std::vector<std::pair<std::string, std::string>> saved_env_;
  std::string dir_;
  std::string packaged_;
};

TEST_F(ResolveEndpointTest, EachSourceInTurn) {
  auto resolved = [&](absl::string_view target = "",
                      absl::string_view socket = "") {
    const Endpoint e = ResolveEndpoint(target, socket, packaged_);
    return e.source + " " + e.target + " " + e.socket_path;
  };
  // Nothing given, no packaged socket: the default.
  EXPECT_EQ(resolved(), "default unix:/run/user/7/hicached.sock "
                        "/run/user/7/hicached.sock");
  // The packaged socket once it exists.
  FILE* f = fopen(packaged_.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  EXPECT_EQ(resolved(), "packaged unix:" + packaged_ + " " + packaged_);
  // The environment before it, HICACHE_TARGET before HICACHE_SOCKET; an
  // empty variable is not given.
  setenv("HICACHE_SOCKET", "", 1);
  EXPECT_EQ(resolved(), "packaged unix:" + packaged_ + " " + packaged_);
  setenv("HICACHE_SOCKET", "/srv/h.sock", 1);
  EXPECT_EQ(resolved(), "HICACHE_SOCKET unix:/srv/h.sock /srv/h.sock");
  setenv("HICACHE_TARGET", "node7:7000", 1);
  EXPECT_EQ(resolved(), "HICACHE_TARGET node7:7000 ");
  setenv("HICACHE_TARGET", "unix:///srv/t.sock", 1);
  EXPECT_EQ(resolved(), "HICACHE_TARGET unix:///srv/t.sock /srv/t.sock");
  // Flags before everything, --target before --socket.
  EXPECT_EQ(resolved("", "/x.sock"), "--socket unix:/x.sock /x.sock");
  EXPECT_EQ(resolved("host:1", "/x.sock"), "--target host:1 ");
}

TEST_F(ResolveEndpointTest, CheckSocketSaysWhatIsWrong) {
  absl::Status s = CheckSocket(packaged_);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), "no daemon at " + packaged_ + " (no such socket)");
  FILE* f = fopen(packaged_.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  s = CheckSocket(packaged_);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is not a socket"));
  unlink(packaged_.c_str());

  int fd = -1;
  ASSERT_NO_FATAL_FAILURE(BindSocket(packaged_, &fd));
  EXPECT_TRUE(CheckSocket(packaged_).ok());
  close(fd);
}

// A user outside the socket's group is told so, with the group, whether the
// socket itself or its directory (0750, as /run/hicached is) keeps them out.
TEST_F(ResolveEndpointTest, PermissionDeniedNamesTheGroup) {
  int fd = -1;
  ASSERT_NO_FATAL_FAILURE(BindSocket(packaged_, &fd));
  ASSERT_EQ(chmod(packaged_.c_str(), 0660), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);  // mkdtemp makes it 0700.
  // As another user: a child that drops to nobody (root can open anything),
  // or this user with the permissions taken away.
  auto check_as_outsider = [&]() -> std::string {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) return "pipe failed";
    const pid_t pid = fork();
    if (pid == 0) {
      close(pipe_fds[0]);
      if (getuid() == 0 && (setgroups(0, nullptr) != 0 || setgid(65534) != 0 ||
                            setuid(65534) != 0)) {
        _exit(3);
      }
      const absl::Status s = CheckSocket(packaged_);
      const std::string text =
          absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
      if (write(pipe_fds[1], text.data(), text.size()) < 0) _exit(4);
      _exit(0);
    }
    close(pipe_fds[1]);
    std::string out;
    char buffer[512];
    for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) > 0;) {
      out.append(buffer, static_cast<size_t>(n));
    }
    close(pipe_fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return out;
  };
  const bool root = getuid() == 0;
  if (!root) ASSERT_EQ(chmod(packaged_.c_str(), 0), 0);
  std::string result = check_as_outsider();
  EXPECT_THAT(result, HasSubstr("PERMISSION_DENIED: permission denied: this "
                                "user may not connect to the socket " +
                                packaged_));
  EXPECT_THAT(result, HasSubstr("add this user to group"));
  // The directory closed (0750 owned by another group, as /run/hicached).
  ASSERT_EQ(chmod(packaged_.c_str(), 0666), 0);
  ASSERT_EQ(chmod(dir_.c_str(), root ? 0750 : 0), 0);
  result = check_as_outsider();
  EXPECT_THAT(result, HasSubstr("PERMISSION_DENIED: permission denied: this "
                                "user may not enter the directory " +
                                dir_));
  ASSERT_EQ(chmod(dir_.c_str(), 0700), 0);
  close(fd);
}

// The service config is JSON naming exactly the retried reads, each retried
// on UNAVAILABLE only, and never a call that changes the daemon's state.
TEST(ServiceConfigTest, RetriesOnlyTheReads) {
  const nlohmann::json config = nlohmann::json::parse(ServiceConfigJson());
  ASSERT_EQ(config["methodConfig"].size(), 1u);
  const nlohmann::json& method = config["methodConfig"][0];
  std::set<std::string> names;
  for (const auto& name : method["name"]) {
    names.insert(name["service"].get<std::string>() + "/" +
                 name["method"].get<std::string>());
  }
  EXPECT_EQ(names.size(), RetriedReadMethods().size());
  for (const char* read :
       {"grpc.health.v1.Health/Check", "hicache.v1.HiCache/GetStats",
        "hicache.v1.HiCache/Stats", "hicache.v1.HiCache/GetLayout",
        "hicache.v1.HiCache/KeepAlive", "hicache.v1.HiCache/DumpTree",
        "hicache.v1.HiCache/InspectNode", "hicache.v1.HiCache/ListSessions"}) {
    EXPECT_TRUE(names.contains(read)) << read;
  }
  for (const char* mutating :
       {"Allocate", "Free", "Insert", "Admit", "Complete", "Lock", "Unlock",
        "MatchPrefix", "OpenSession", "CloseSession", "Evict", "Pin",
        "SetFreeRoom", "FinishLoad", "RegisterFence", "ReleaseFence"}) {
    EXPECT_FALSE(names.contains(std::string("hicache.v1.HiCache/") + mutating))
        << mutating;
  }
  EXPECT_EQ(method["waitForReady"], true);
  const nlohmann::json& retry = method["retryPolicy"];
  EXPECT_EQ(retry["maxAttempts"], kReadMaxAttempts);
  EXPECT_EQ(retry["retryableStatusCodes"], nlohmann::json({"UNAVAILABLE"}));
  EXPECT_EQ(nlohmann::json::parse(
                ServiceConfigJson(false))["methodConfig"][0]["waitForReady"],
            false);
}

}  // namespace
}  // namespace hicache::client
