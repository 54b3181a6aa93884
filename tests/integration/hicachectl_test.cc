// The real hicachectl binary against the real hicached (issue 14): --version
// with the stamped git revision, global flags after the command, one JSON
// document per invocation, free-room read path, tree paging, errors that
// name the gRPC code and say what to do, and the documented exit codes.
#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/binaries.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache {
namespace {

using testing::CtlPath;
using testing::DaemonPath;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using testing::RunResult;
using testing::Subprocess;

RunResult RunBinary(std::vector<std::string> argv) {
  absl::StatusOr<RunResult> result = testing::Run(argv);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : RunResult{};
}

// `text` is exactly one JSON document on one line.
nlohmann::json OneDocument(const std::string& text) {
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(doc.is_discarded()) << text;
  return doc;
}

class HicachectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chmod(dir_.path().c_str(), 0755);  // Another user may reach the socket.
    absl::StatusOr<Subprocess> daemon =
        Subprocess::Start({DaemonPath(), "--socket=" + socket_,
                           "--l1_free_room_pages=7", "--l2_free_room_pages=9",
                           "--namespace_quotas=tenant-a:device_limit=64,"
                           "device_guaranteed=16"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_.emplace(*std::move(daemon));
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline && daemon_->Running()) {
      if (Ctl({"--timeout=1", "health"}).exit_code == 0) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "hicached did not become healthy:\n" << daemon_->Stderr();
  }

  RunResult Ctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {CtlPath()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--socket=" + socket_);  // Globals go after, too.
    return RunBinary(argv);
  }

  testing::TempDir dir_;
  const std::string socket_ = dir_.Child("hicached.sock");
  std::optional<Subprocess> daemon_;
};

TEST_F(HicachectlTest, VersionCarriesTheGitRevision) {
  for (std::vector<std::string> args : {std::vector<std::string>{"--version"},
                                        {"tree", "--version"},
                                        {"free-room", "--version"},
                                        {"node", "--version"}}) {
    args.insert(args.begin(), CtlPath());
    RunResult r = RunBinary(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, MatchesRegex("hicachectl [0-9]+\\.[0-9]+\\.[0-9]+ "
                                    "\\(([0-9a-f]{12}(-dirty)?|unknown)\\)\n"));
  }
}

TEST_F(HicachectlTest, OneJsonDocumentWithFlagsAfterTheCommand) {
  RunResult r = Ctl({"health", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(OneDocument(r.out)["status"], "SERVING");
  r = Ctl({"stats", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json stats = OneDocument(r.out);
  EXPECT_TRUE(stats["daemon"]["pid"].is_string());  // int64: proto3 JSON.
  EXPECT_EQ(stats["daemon"]["settings"]["l1_free_room_pages"], "7");
  EXPECT_TRUE(stats["cache"]["lanes"].is_array());
  r = Ctl({"tree", "--json", "--sort", "hits", "--limit", "5"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json tree = OneDocument(r.out);
  EXPECT_EQ(tree["nodes"], nlohmann::json::array());
  EXPECT_EQ(tree["next_page_token"], "");
  EXPECT_EQ(tree["total_nodes"], "0");
}

TEST_F(HicachectlTest, FreeRoomWithoutArgumentsChangesNothing) {
  for (int i = 0; i < 2; ++i) {
    RunResult r = Ctl({"free-room"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out,
              "free-room targets: L1 7 pages per lane, L2 9 pages per rank\n");
  }
  RunResult r = Ctl({"free-room", "--l1", "3", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(OneDocument(r.out),
            nlohmann::json::parse(
                R"({"l1_pages_per_lane":"3","l2_pages_per_rank":"9"})"));
}

TEST_F(HicachectlTest, ExitCodesAndMessages) {
  RunResult r = Ctl({"stats", "--colour"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown option '--colour'"));
  r = Ctl({"tree", "--limit", "many"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--limit"));
  r = Ctl({"tree", "--page_token", "not-a-token"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT: page_token"));
  r = Ctl({"node", "424242"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
  const std::string missing = dir_.Child("none.sock");
  r = RunBinary({CtlPath(), "health", "--timeout=0.5", "--socket=" + missing});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err,
              HasSubstr("no daemon at " + missing + " (no such socket)"));
  EXPECT_THAT(r.err, HasSubstr("is hicached running? check --socket"));
}

// Finding the daemon without flags: $HICACHE_SOCKET (and $HICACHE_TARGET)
// name it; a user who may not reach the socket is told so and which group
// to join, at once, not "no daemon" after retries.
TEST_F(HicachectlTest, FindsTheDaemonFromTheEnvironment) {
  RunResult r = RunBinary(
      {"/usr/bin/env", "-u", "HICACHE_TARGET", "HICACHE_SOCKET=" + socket_,
       CtlPath(), "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  r = RunBinary({"/usr/bin/env", "HICACHE_SOCKET=/nonexistent.sock",
                 "HICACHE_TARGET=unix:" + socket_, CtlPath(), "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // A flag wins over the environment.
  r = RunBinary({"/usr/bin/env", "HICACHE_SOCKET=" + socket_, CtlPath(),
                 "--socket=" + dir_.Child("none.sock"), "--timeout=0.5",
                 "health"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no daemon at " + dir_.Child("none.sock")));
  if (getuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "acting as another user needs root and setpriv";
  }
  // As nobody, outside the socket's group (the daemon makes it 0660).
  r = RunBinary({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                 "--clear-groups", CtlPath(), "--socket=" + socket_,
                 "health"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("permission denied: this user may not connect "
                               "to the socket " + socket_));
  EXPECT_THAT(r.err, HasSubstr("mode 0660"));
  EXPECT_THAT(r.err, HasSubstr("add this user to group"));
}

// Namespace quotas (docs/quotas.md): the flag's quota is listed, set keeps
// what it is not told, --clear removes, and bad values say what is wrong.
TEST_F(HicachectlTest, QuotaListsAndSetsNamespaceQuotas) {
  RunResult r = Ctl({"quota", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json list = OneDocument(r.out);
  ASSERT_EQ(list["namespaces"].size(), 1u) << r.out;
  EXPECT_EQ(list["namespaces"][0]["quota"]["namespace"], "tenant-a");
  EXPECT_EQ(list["namespaces"][0]["quota"]["device_limit_pages"], "64");
  EXPECT_EQ(list["namespaces"][0]["quota"]["device_guaranteed_pages"], "16");
  r = Ctl({"quota"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("'tenant-a'"));
  EXPECT_THAT(r.out, HasSubstr("0 / 64 (16)"));
  // A new option keeps the others.
  r = Ctl({"quota", "--ns", "tenant-a", "--host-limit", "128"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "quota of namespace 'tenant-a': device limit 64, guaranteed 16; "
            "host limit 128, guaranteed 0 (pages; 0 = none)\n");
  r = Ctl({"quota", "--ns", "", "--device-guaranteed", "8"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Ctl({"quota", "--json"});
  list = OneDocument(r.out);
  ASSERT_EQ(list["namespaces"].size(), 2u) << r.out;
  EXPECT_EQ(list["namespaces"][0]["quota"]["namespace"], "");
  EXPECT_EQ(list["namespaces"][1]["quota"]["host_limit_pages"], "128");
  // Refusals: the daemon's words, nothing changed.
  r = Ctl({"quota", "--ns", "tenant-a", "--device-guaranteed", "65"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("device_guaranteed (65) is above device_limit"));
  r = Ctl({"quota", "--device-limit", "5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--ns NS"));
  r = Ctl({"quota", "--ns", "tenant-a", "--device-limit", "-5"});
  EXPECT_EQ(r.exit_code, 2);
  r = Ctl({"quota", "--ns", "tenant-a", "--clear", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Ctl({"quota", "--json"});
  list = OneDocument(r.out);
  ASSERT_EQ(list["namespaces"].size(), 1u) << r.out;
  EXPECT_EQ(list["namespaces"][0]["quota"]["namespace"], "");
}

TEST(HicachedFlagsTest, BadNamespaceQuotaFlagRefusesToStart) {
  testing::TempDir dir;
  for (const char* bad : {"tenant-a", "tenant-a:device_limit=x",
                          "tenant-a:colour=3", "a:device_limit=4;a:host_limit=4",
                          "a:device_limit=4,device_guaranteed=5"}) {
    RunResult r = RunBinary({DaemonPath(), "--socket=" + dir.Child("s.sock"),
                             absl::StrCat("--namespace_quotas=", bad)});
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("quota")) << bad;
  }
}

// A non-operator's operator RPC: the code in words and where to look.
TEST_F(HicachectlTest, PermissionDeniedSaysWhatToDo) {
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "needs root and setpriv to run hicachectl as another user";
  }
  chmod(socket_.c_str(), 0666);
  RunResult r =
      RunBinary({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                 "--clear-groups", CtlPath(), "--socket=" + socket_, "tree"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_THAT(r.err, HasSubstr("hicachectl: PERMISSION_DENIED: DumpTree is an "
                               "operator RPC"));
  EXPECT_THAT(r.err, HasSubstr("--operator_uids"));
  EXPECT_THAT(r.err, HasSubstr("docs/security.md"));
  // Quotas are operators' too, to read and to set.
  for (std::vector<std::string> args :
       {std::vector<std::string>{"quota"},
        {"quota", "--ns", "tenant-a", "--device-limit", "1000000"}}) {
    std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=65534",
                                     "--regid=65534", "--clear-groups",
                                     CtlPath(), "--socket=" + socket_};
    argv.insert(argv.end(), args.begin(), args.end());
    r = RunBinary(argv);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_THAT(r.err, HasSubstr("ListQuotas is an operator RPC"));
  }
  r = Ctl({"quota", "--json"});
  EXPECT_EQ(OneDocument(r.out)["namespaces"][0]["quota"]["device_limit_pages"],
            "64");
}

}  // namespace
}  // namespace hicache
