#pragma once

// A CP group of real hicached processes on localhost (issue 13,
// docs/cp-groups.md): one leader and followers, each with its own unix
// socket, shared-memory instance and temporary directory, linked over Gloo
// TCP on 127.0.0.1.
//
// - The leader listens on `--listen_tcp=127.0.0.1:0 --insecure_tcp_for_testing`
//   (the OS picks the port); its target is read from its log line
//   "CP group <name>: leading on <host:port>", or else from its GetStats
//   cp_group.leader_address.
// - Followers get `--cp_group_leader=<that target>`,
//   `--insecure_tcp_for_testing` (their channel to the leader is plain TCP
//   too) and `--ranks` of their own; members are named "m<index>"
//   (`--cp_group_member`), the leader m0.
// - Start() returns once the leader's GetStats says the group is "formed".
//
// Waiting is bounded: process start-up and state changes are observed by
// polling GetStats with short pauses up to a deadline (there is no stream
// of group state changes to wait on); there are no fixed sleeps.
//
// The destructor SIGKILLs every member still running and removes the
// /dev/shm entries of every instance it created (also after a failure).
//
// Not thread-safe: one test thread drives it.
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "hicache/v1/hicache.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace hicache::cp_group_testing {

// Heartbeats and the silence timeout of the test groups. Short, so that a
// silent member is found quickly, but not so short that a loaded 2-core CI
// machine delays a heartbeat past it: with 500 ms, TSan builds lost live
// peers (a Gloo receive timing out while the other daemon was starved).
#if defined(HICACHE_TSAN) || defined(HICACHE_ASAN)
inline constexpr int kTestHeartbeatMs = 100;
inline constexpr int kTestTimeoutMs = 5000;
#else
inline constexpr int kTestHeartbeatMs = 50;
inline constexpr int kTestTimeoutMs = 2000;
#endif

struct GroupSpec {
  uint32_t cp_size = 4;
  // ranks[0]: the leader's; ranks[i]: follower i's. Each contiguous; all
  // of them together partition [0, cp_size).
  std::vector<std::vector<uint32_t>> ranks;
  std::string name = "g";
  uint32_t page_size = 4;
  std::string kv_preset = "tiny-draft";
  uint64_t device_pages_per_rank = 16;
  uint64_t host_pages_per_rank = 32;
  int heartbeat_ms = kTestHeartbeatMs;
  int timeout_ms = kTestTimeoutMs;
  int join_timeout_ms = 20000;
  // Appended to every member's flags (a later flag wins).
  std::vector<std::string> extra_flags;
};

// "c4_2p2" for C = 4 split 2 + 2 (a test-name-safe label).
std::string SplitLabel(const GroupSpec& spec);

class CpGroup {
 public:
  explicit CpGroup(GroupSpec spec);
  ~CpGroup();
  CpGroup(const CpGroup&) = delete;
  CpGroup& operator=(const CpGroup&) = delete;

  const GroupSpec& spec() const { return spec_; }
  size_t size() const { return members_.size(); }

  // Starts the leader, then every follower, and waits until the leader and
  // every follower report the group "formed" (within `timeout`).
  absl::Status Start(absl::Duration timeout = absl::Seconds(60));

  // Starts the leader and waits until it answers on its socket and its TCP
  // target is known.
  absl::Status StartLeader(absl::Duration timeout = absl::Seconds(30));
  // Starts follower `member` (>= 1) with its ranks and waits until it
  // answers on its socket (it may not have joined yet). A member that ran
  // before is started again under the same name, instance and socket.
  // `extra_flags` go after the usual ones (e.g. a mismatched --page_size).
  absl::Status StartFollower(size_t member,
                             const std::vector<std::string>& extra_flags = {},
                             absl::Duration timeout = absl::Seconds(30));
  // Starts follower `member` without waiting for anything.
  absl::Status LaunchFollower(size_t member,
                              const std::vector<std::string>& extra_flags = {});

  // Sends `signal` to a running member.
  absl::Status Signal(size_t member, int signal) const;
  // SIGKILLs a member and reaps it.
  absl::Status Kill(size_t member);
  // SIGTERM, then waits up to `timeout` for the exit code.
  absl::StatusOr<int> Stop(size_t member,
                           absl::Duration timeout = absl::Seconds(20));
  // Waits for a member to exit; its exit code (128 + signal for a signal).
  absl::StatusOr<int> WaitExit(size_t member, absl::Duration timeout);
  bool Running(size_t member) const;

  // GetStats of a member over its unix socket (a 2 s deadline).
  absl::StatusOr<v1::GetStatsResponse> GetStats(size_t member) const;
  // Polls `member`'s GetStats until `done(cp_group)` holds, every `pause`,
  // up to `timeout`; DEADLINE_EXCEEDED naming `what` and the last status
  // seen otherwise, FAILED_PRECONDITION if the member exited.
  absl::StatusOr<v1::CpGroupStatus> WaitForGroup(
      size_t member, const std::function<bool(const v1::CpGroupStatus&)>& done,
      absl::string_view what, absl::Duration timeout = absl::Seconds(30),
      absl::Duration pause = absl::Milliseconds(5)) const;
  // Waits until the leader and every running follower report "formed"
  // (a follower hears it a little after the leader admitted it). Returns
  // the leader's view.
  absl::StatusOr<v1::CpGroupStatus> WaitFormed(
      absl::Duration timeout = absl::Seconds(60)) const;
  // WaitForGroup until state == `state`.
  absl::StatusOr<v1::CpGroupStatus> WaitForState(
      size_t member, absl::string_view state,
      absl::Duration timeout = absl::Seconds(30)) const;

  // The member that holds `rank`'s pools.
  size_t MemberOfRank(uint32_t rank) const;
  const std::string& socket(size_t member) const {
    return members_[member].socket;
  }
  const std::string& instance(size_t member) const {
    return members_[member].instance;
  }
  const std::string& member_name(size_t member) const {
    return members_[member].name;
  }
  // A stub over the member's unix socket (a fresh channel when it restarts).
  std::shared_ptr<v1::HiCache::Stub> stub(size_t member) const {
    return members_[member].stub;
  }
  // The leader's TCP target ("127.0.0.1:PORT"), once StartLeader succeeded.
  const std::string& leader_target() const { return leader_target_; }
  // The member's stderr (its log), "" if it never ran.
  std::string Log(size_t member) const;
  // The last `lines` log lines of every member, for failure messages.
  std::string DescribeLogs(int lines = 25) const;

 private:
  struct Member {
    std::string name;
    std::vector<uint32_t> ranks;
    std::string socket;
    std::string instance;
    std::unique_ptr<testing::Subprocess> process;
    std::shared_ptr<v1::HiCache::Stub> stub;
    std::string last_log;  // Log of the previous run, kept on restart.
  };

  std::vector<std::string> CommonFlags(const Member& member) const;
  absl::Status Launch(size_t member, std::vector<std::string> argv);
  // Waits until the member answers GetStats on its socket.
  absl::Status WaitServing(size_t member, absl::Duration timeout);

  const GroupSpec spec_;
  testing::TempDir dir_;
  std::vector<Member> members_;
  std::string leader_target_;
};

}  // namespace hicache::cp_group_testing
