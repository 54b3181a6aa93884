#include "tools/gpu_runner/timed_command.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace hicache::gpu_runner {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(TimedCommandTest, ReportsTheExitStatusAndAppendsOutputToTheLog) {
  testing::TempDir dir;
  const std::string log = dir.Child("log");
  std::ofstream(log) << "before\n";
  absl::StatusOr<CommandResult> r =
      RunTimed({.argv = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3"},
                .env = {"PATH=/usr/bin:/bin"},
                .log_path = log,
                .limit = absl::Minutes(5)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rc, 3);
  EXPECT_FALSE(r->timed_out);
  EXPECT_EQ(Read(log), "before\nout\nerr\n");
}

TEST(TimedCommandTest, PassesOnlyTheGivenEnvironment) {
  testing::TempDir dir;
  const std::string log = dir.Child("log");
  absl::StatusOr<CommandResult> r =
      RunTimed({.argv = {"/bin/sh", "-c", "echo \"[$ONLY][$HOME]\""},
                .env = {"ONLY=this"},
                .log_path = log});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rc, 0);
  EXPECT_EQ(Read(log), "[this][]\n");
}

TEST(TimedCommandTest, ASignalIs128PlusItsNumber) {
  testing::TempDir dir;
  absl::StatusOr<CommandResult> r = RunTimed(
      {.argv = {"/bin/sh", "-c", "kill -9 $$"}, .log_path = dir.Child("log")});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->rc, 128 + 9);
}

// A command that never ends on its own, with a child that ignores SIGTERM:
// the time box stops the whole group (SIGTERM, then SIGKILL after the
// grace) and reports 124. The child holds the write end of a pipe, so the
// read below returns (end of file) only once it is dead: nothing here
// depends on how fast the machine is, and a survivor would hang the test.
TEST(TimedCommandTest, TheTimeBoxStopsTheWholeGroup) {
  testing::TempDir dir;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);  // Inherited by the command (no CLOEXEC).
  absl::StatusOr<CommandResult> r = RunTimed(
      {.argv = {"/bin/sh", "-c",
                "sh -c 'trap \"\" TERM; while :; do sleep 1; done' & wait"},
       .env = {"PATH=/usr/bin:/bin"},
       .log_path = dir.Child("log"),
       .limit = absl::Milliseconds(300),
       .grace = absl::Milliseconds(300)});
  close(pipe_fds[1]);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->rc, 124);
  char byte;
  EXPECT_EQ(read(pipe_fds[0], &byte, 1), 0);  // Every holder is gone.
  close(pipe_fds[0]);
}

TEST(TimedCommandTest, AProgramThatCannotStartIsAnError) {
  testing::TempDir dir;
  absl::StatusOr<CommandResult> r = RunTimed(
      {.argv = {dir.Child("absent")}, .log_path = dir.Child("log")});
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(RunTimed({.argv = {"/bin/true"},
                         .log_path = dir.Child("no/such/dir/log")})
                   .ok());
}

TEST(TimedCommandTest, FindInPathSkipsMissingAndNonExecutableEntries) {
  testing::TempDir dir;
  std::ofstream(dir.Child("plain")) << "not executable";
  EXPECT_EQ(FindInPath("plain", dir.path()), "");
  EXPECT_EQ(FindInPath("sh", dir.path() + "::/nonexistent:/bin"), "/bin/sh");
  EXPECT_EQ(FindInPath("no-such-program-here", "/bin:/usr/bin"), "");
}

}  // namespace
}  // namespace hicache::gpu_runner
