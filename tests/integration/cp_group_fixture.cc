#include "tests/integration/cp_group_fixture.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/endpoint.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "tests/testing/binaries.h"

namespace hicache::cp_group_testing {
namespace {

using testing::Subprocess;

std::atomic<int> group_counter{0};

std::shared_ptr<v1::HiCache::Stub> NewStub(const std::string& socket) {
  return v1::HiCache::NewStub(grpc::CreateChannel(
      client::UnixTarget(socket), grpc::InsecureChannelCredentials()));
}

absl::StatusOr<v1::GetStatsResponse> CallGetStats(v1::HiCache::Stub& stub,
                                                  absl::Duration deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::GetStatsResponse stats;
  const grpc::Status status = stub.GetStats(&ctx, v1::GetStatsRequest(), &stats);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return stats;
}

// The target in "CP group <name>: leading on <target>", or "".
std::string LeaderTargetFromLog(const std::string& log,
                                const std::string& group) {
  const std::string marker = absl::StrCat("CP group ", group, ": leading on ");
  const size_t at = log.find(marker);
  if (at == std::string::npos) return "";
  size_t begin = at + marker.size();
  size_t end = begin;
  while (end < log.size() && log[end] != ' ' && log[end] != '\n' &&
         log[end] != '\r' && log[end] != ',' && log[end] != ';' &&
         log[end] != ')') {
    ++end;
  }
  std::string target = log.substr(begin, end - begin);
  // A line may quote it.
  while (!target.empty() && (target.back() == '"' || target.back() == '\'' ||
                             target.back() == '.')) {
    target.pop_back();
  }
  while (!target.empty() && (target.front() == '"' || target.front() == '\'')) {
    target.erase(0, 1);
  }
  return target;
}

std::string LastLines(const std::string& text, int lines) {
  std::vector<absl::string_view> all = absl::StrSplit(text, '\n');
  const size_t from = all.size() > static_cast<size_t>(lines)
                          ? all.size() - static_cast<size_t>(lines)
                          : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

void RemoveShmOf(const std::string& instance) {
  const std::string prefix = "hicache-" + instance;
  std::vector<std::string> doomed;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (!absl::StartsWith(name, prefix)) continue;
      const std::string rest = name.substr(prefix.size());
      if (absl::StartsWith(rest, "-") || rest == ".lock") doomed.push_back(name);
    }
    closedir(dir);
  }
  for (const std::string& name : doomed) unlink(("/dev/shm/" + name).c_str());
}

}  // namespace

std::string SplitLabel(const GroupSpec& spec) {
  std::vector<std::string> sizes;
  for (const auto& ranks : spec.ranks) sizes.push_back(absl::StrCat(ranks.size()));
  return absl::StrCat("c", spec.cp_size, "_", absl::StrJoin(sizes, "p"));
}

CpGroup::CpGroup(GroupSpec spec) : spec_(std::move(spec)) {
  const int id = group_counter.fetch_add(1);
  for (size_t i = 0; i < spec_.ranks.size(); ++i) {
    Member m;
    m.name = absl::StrCat("m", i);
    m.ranks = spec_.ranks[i];
    m.socket = dir_.Child(absl::StrCat("m", i, ".sock"));
    m.instance = absl::StrCat("cpg", getpid(), "x", id, "m", i);
    members_.push_back(std::move(m));
  }
}

CpGroup::~CpGroup() {
  for (Member& m : members_) {
    m.process.reset();  // SIGKILLs and reaps one still running.
    RemoveShmOf(m.instance);
  }
}

std::vector<std::string> CpGroup::CommonFlags(const Member& member) const {
  std::vector<std::string> flags = {
      testing::DaemonPath(),
      "--socket=" + member.socket,
      "--instance=" + member.instance,
      absl::StrCat("--cp_size=", spec_.cp_size),
      absl::StrCat("--page_size=", spec_.page_size),
      "--kv_preset=" + spec_.kv_preset,
      absl::StrCat("--device_pages_per_rank=", spec_.device_pages_per_rank),
      absl::StrCat("--host_pages_per_rank=", spec_.host_pages_per_rank),
      "--ranks=" + absl::StrJoin(member.ranks, ","),
      "--cp_group=" + spec_.name,
      "--cp_group_member=" + member.name,
      "--cp_group_bind=127.0.0.1",
      absl::StrCat("--cp_group_heartbeat_ms=", spec_.heartbeat_ms),
      absl::StrCat("--cp_group_timeout_ms=", spec_.timeout_ms),
      absl::StrCat("--cp_group_join_timeout_ms=", spec_.join_timeout_ms),
      "--default_lease_ms=2000",
      "--shutdown_grace_seconds=1",
      "--log_level=info",
  };
  return flags;
}

absl::Status CpGroup::Launch(size_t member, std::vector<std::string> argv) {
  Member& m = members_[member];
  argv.insert(argv.end(), spec_.extra_flags.begin(), spec_.extra_flags.end());
  if (m.process != nullptr) {
    m.last_log = m.process->Stderr();
    m.process.reset();
  }
  auto process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  m.process = std::make_unique<Subprocess>(*std::move(process));
  m.stub = NewStub(m.socket);
  return absl::OkStatus();
}

absl::Status CpGroup::WaitServing(size_t member, absl::Duration timeout) {
  Member& m = members_[member];
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last = absl::UnavailableError("not asked yet");
  while (absl::Now() < deadline) {
    if (!m.process->Running()) {
      return absl::FailedPreconditionError(absl::StrCat(
          m.name, " exited before serving: ", LastLines(Log(member), 30)));
    }
    // A fresh channel per attempt: no reconnect backoff from the attempts
    // made before the daemon listened.
    std::shared_ptr<v1::HiCache::Stub> stub = NewStub(m.socket);
    absl::StatusOr<v1::GetStatsResponse> stats =
        CallGetStats(*stub, absl::Seconds(1));
    if (stats.ok()) {
      m.stub = std::move(stub);
      return absl::OkStatus();
    }
    last = stats.status();
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      m.name, " did not answer GetStats within ", absl::FormatDuration(timeout),
      " (last: ", last.ToString(), "): ", LastLines(Log(member), 30)));
}

absl::Status CpGroup::StartLeader(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> argv = CommonFlags(members_[0]);
  argv.push_back("--listen_tcp=127.0.0.1:0");
  argv.push_back("--insecure_tcp_for_testing");
  if (absl::Status s = Launch(0, std::move(argv)); !s.ok()) return s;
  if (absl::Status s = WaitServing(0, timeout); !s.ok()) return s;
  leader_target_.clear();
  while (absl::Now() < deadline) {
    leader_target_ = LeaderTargetFromLog(Log(0), spec_.name);
    if (!leader_target_.empty()) return absl::OkStatus();
    absl::StatusOr<v1::GetStatsResponse> stats = GetStats(0);
    if (stats.ok() && !stats->cp_group().leader_address().empty()) {
      leader_target_ = stats->cp_group().leader_address();
      return absl::OkStatus();
    }
    if (!Running(0)) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "the leader's TCP target is neither logged (\"CP group ", spec_.name,
      ": leading on ...\") nor in GetStats cp_group.leader_address: ",
      LastLines(Log(0), 30)));
}

absl::Status CpGroup::LaunchFollower(size_t member,
                                     const std::vector<std::string>& extra) {
  if (member == 0 || member >= members_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("no follower ", member));
  }
  if (leader_target_.empty()) {
    return absl::FailedPreconditionError("start the leader first");
  }
  std::vector<std::string> argv = CommonFlags(members_[member]);
  argv.push_back("--cp_group_leader=" + leader_target_);
  // The leader listens without TLS; so must the follower's channel to it.
  argv.push_back("--insecure_tcp_for_testing");
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Launch(member, std::move(argv));
}

absl::Status CpGroup::StartFollower(size_t member,
                                    const std::vector<std::string>& extra,
                                    absl::Duration timeout) {
  if (absl::Status s = LaunchFollower(member, extra); !s.ok()) return s;
  return WaitServing(member, timeout);
}

absl::Status CpGroup::Start(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (absl::Status s = StartLeader(timeout); !s.ok()) return s;
  // Launch every follower first: their start-ups overlap.
  for (size_t i = 1; i < members_.size(); ++i) {
    if (absl::Status s = LaunchFollower(i); !s.ok()) return s;
  }
  for (size_t i = 1; i < members_.size(); ++i) {
    if (absl::Status s = WaitServing(i, deadline - absl::Now()); !s.ok()) {
      return s;
    }
  }
  // Formed, or a follower gave up (a refused or failed join): fail fast
  // with its log rather than at the deadline.
  size_t exited = members_.size();
  absl::StatusOr<v1::CpGroupStatus> formed = WaitForGroup(
      0,
      [&](const v1::CpGroupStatus& g) {
        for (size_t i = 1; i < members_.size(); ++i) {
          if (!Running(i)) exited = i;
        }
        return g.state() == "formed" || exited < members_.size();
      },
      "state \"formed\"", deadline - absl::Now());
  if (!formed.ok()) return formed.status();
  if (exited < members_.size() && formed->state() != "formed") {
    return absl::FailedPreconditionError(
        absl::StrCat(members_[exited].name, " exited before the group formed: ",
                     LastLines(Log(exited), 30)));
  }
  return WaitFormed(deadline - absl::Now()).status();
}

absl::StatusOr<v1::CpGroupStatus> CpGroup::WaitFormed(
    absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::StatusOr<v1::CpGroupStatus> leader = WaitForState(0, "formed", timeout);
  if (!leader.ok()) return leader.status();
  for (size_t i = 1; i < members_.size(); ++i) {
    if (!Running(i)) continue;
    absl::StatusOr<v1::CpGroupStatus> follower =
        WaitForState(i, "formed", deadline - absl::Now());
    if (!follower.ok()) return follower.status();
  }
  return leader;
}

absl::Status CpGroup::Signal(size_t member, int signal) const {
  const Member& m = members_[member];
  if (m.process == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(m.name, " never ran"));
  }
  return m.process->Signal(signal);
}

absl::Status CpGroup::Kill(size_t member) {
  if (absl::Status s = Signal(member, SIGKILL); !s.ok()) return s;
  absl::StatusOr<int> code = WaitExit(member, absl::Seconds(10));
  return code.status();
}

absl::StatusOr<int> CpGroup::Stop(size_t member, absl::Duration timeout) {
  if (absl::Status s = Signal(member, SIGTERM); !s.ok()) return s;
  return WaitExit(member, timeout);
}

absl::StatusOr<int> CpGroup::WaitExit(size_t member, absl::Duration timeout) {
  Member& m = members_[member];
  if (m.process == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(m.name, " never ran"));
  }
  return m.process->Wait(timeout);
}

bool CpGroup::Running(size_t member) const {
  const Member& m = members_[member];
  return m.process != nullptr && m.process->Running();
}

absl::StatusOr<v1::GetStatsResponse> CpGroup::GetStats(size_t member) const {
  return CallGetStats(*members_[member].stub, absl::Seconds(2));
}

absl::StatusOr<v1::CpGroupStatus> CpGroup::WaitForGroup(
    size_t member, const std::function<bool(const v1::CpGroupStatus&)>& done,
    absl::string_view what, absl::Duration timeout,
    absl::Duration pause) const {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (true) {
    if (!Running(member)) {
      return absl::FailedPreconditionError(
          absl::StrCat(members_[member].name, " exited while waiting for ",
                       what, ": ", LastLines(Log(member), 30)));
    }
    absl::StatusOr<v1::GetStatsResponse> stats = GetStats(member);
    if (stats.ok()) {
      if (done(stats->cp_group())) return stats->cp_group();
      last = stats->cp_group().ShortDebugString();
    } else {
      last = stats.status().ToString();
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(pause);
  }
  return absl::DeadlineExceededError(
      absl::StrCat(members_[member].name, ": no ", what, " within ",
                   absl::FormatDuration(timeout), "; last seen: ", last));
}

absl::StatusOr<v1::CpGroupStatus> CpGroup::WaitForState(
    size_t member, absl::string_view state, absl::Duration timeout) const {
  const std::string wanted(state);
  return WaitForGroup(
      member,
      [&wanted](const v1::CpGroupStatus& g) { return g.state() == wanted; },
      absl::StrCat("state \"", wanted, "\""), timeout);
}

size_t CpGroup::MemberOfRank(uint32_t rank) const {
  for (size_t i = 0; i < members_.size(); ++i) {
    for (uint32_t r : members_[i].ranks) {
      if (r == rank) return i;
    }
  }
  return members_.size();
}

std::string CpGroup::Log(size_t member) const {
  const Member& m = members_[member];
  return m.process == nullptr ? m.last_log : m.process->Stderr();
}

std::string CpGroup::DescribeLogs(int lines) const {
  std::string out;
  for (size_t i = 0; i < members_.size(); ++i) {
    absl::StrAppend(&out, "\n---- ", members_[i].name, " (ranks ",
                    absl::StrJoin(members_[i].ranks, ","), ") log tail:\n",
                    LastLines(Log(i), lines));
  }
  return out;
}

}  // namespace hicache::cp_group_testing
