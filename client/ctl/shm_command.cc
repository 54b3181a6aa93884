#include "client/ctl/shm_command.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/ctl/cli.h"
#include "client/ctl/output_format.h"

namespace hicache::ctl {
namespace {

constexpr absl::string_view kPrefix = "hicache-";
constexpr absl::string_view kLockSuffix = ".lock";

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return absl::ascii_isdigit(static_cast<unsigned char>(ch));
  });
}

bool AllLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return absl::ascii_isdigit(static_cast<unsigned char>(ch)) ||
           (ch >= 'a' && ch <= 'f');
  });
}

bool AllLowerLetters(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return ch >= 'a' && ch <= 'z';
  });
}

// An instance id as hicached accepts it: a letter, then [A-Za-z0-9_-].
bool ValidId(absl::string_view id) {
  if (id.empty() || id.size() > 64 ||
      !absl::ascii_isalpha(static_cast<unsigned char>(id[0]))) {
    return false;
  }
  return std::all_of(id.begin(), id.end(), [](char ch) {
    return absl::ascii_isalnum(static_cast<unsigned char>(ch)) || ch == '_' ||
           ch == '-';
  });
}

std::string ReadPid(int fd) {
  char buffer[32] = {};
  const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
  if (n <= 0) return "";
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buffer, n)));
}

std::string StateName(ShmInstanceInfo::State state) {
  switch (state) {
    case ShmInstanceInfo::State::kLive:
      return "live";
    case ShmInstanceInfo::State::kStopped:
      return "stopped";
    case ShmInstanceInfo::State::kOrphaned:
      return "orphaned";
  }
  return "?";
}

uint64_t Total(const ShmInstanceInfo& i, bool resident) {
  uint64_t sum = 0;
  for (const ShmSegmentInfo& s : i.segments) {
    sum += resident ? s.resident : s.bytes;
  }
  return sum;
}

}  // namespace

std::string InstanceOfSegment(const std::string& file_name) {
  absl::string_view rest = file_name;
  if (!absl::ConsumePrefix(&rest, kPrefix)) return "";
  // "...-host-r<digits>-g<16 hex>": a host tier kept for hot restart.
  absl::string_view tail = rest;
  if (const size_t g = tail.rfind("-g");
      g != absl::string_view::npos && tail.size() - g == 18 &&
      AllLowerHex(tail.substr(g + 2))) {
    tail = tail.substr(0, g);
  }
  // "...-<kind>-r<digits>".
  const size_t r = tail.rfind("-r");
  if (r == absl::string_view::npos || !AllDigits(tail.substr(r + 2))) {
    return "";
  }
  const absl::string_view before_rank = tail.substr(0, r);
  const size_t k = before_rank.rfind('-');
  if (k == absl::string_view::npos ||
      !AllLowerLetters(before_rank.substr(k + 1))) {
    return "";
  }
  const absl::string_view id = before_rank.substr(0, k);
  return ValidId(id) ? std::string(id) : "";
}

std::vector<ShmInstanceInfo> ScanShm(const std::string& dir) {
  std::map<std::string, ShmInstanceInfo> by_id;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return {};
  const int dir_fd = dirfd(d);
  std::vector<std::string> locks;
  while (const dirent* entry = readdir(d)) {
    const std::string name = entry->d_name;
    absl::string_view view = name;
    if (absl::ConsumePrefix(&view, kPrefix) &&
        absl::ConsumeSuffix(&view, kLockSuffix) && ValidId(view)) {
      locks.push_back(std::string(view));
      by_id[std::string(view)].id = std::string(view);
      continue;
    }
    const std::string id = InstanceOfSegment(name);
    if (id.empty()) continue;
    struct stat st {};
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode)) {
      continue;
    }
    ShmInstanceInfo& info = by_id[id];
    info.id = id;
    info.segments.push_back({name, static_cast<uint64_t>(st.st_size),
                             static_cast<uint64_t>(st.st_blocks) * 512,
                             st.st_uid});
  }
  for (const std::string& id : locks) {
    ShmInstanceInfo& info = by_id[id];
    const std::string path = absl::StrCat(kPrefix, id, kLockSuffix);
    const int fd = openat(dir_fd, path.c_str(),
                          O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) continue;
    info.pid = ReadPid(fd);
    // A shared probe: refused while the daemon holds its exclusive lock.
    if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      info.state = ShmInstanceInfo::State::kLive;
    } else {
      info.state = ShmInstanceInfo::State::kStopped;
      flock(fd, LOCK_UN);
    }
    close(fd);
  }
  closedir(d);
  std::vector<ShmInstanceInfo> out;
  for (auto& [id, info] : by_id) {
    std::sort(info.segments.begin(), info.segments.end(),
              [](const ShmSegmentInfo& a, const ShmSegmentInfo& b) {
                return a.name < b.name;
              });
    out.push_back(std::move(info));
  }
  return out;
}

int RunShmList(const ShmOptions& o, const CommandContext& c) {
  const std::vector<ShmInstanceInfo> instances = ScanShm(o.dir);
  if (c.json) {
    Json doc = Json::array();
    for (const ShmInstanceInfo& i : instances) {
      Json segments = Json::array();
      for (const ShmSegmentInfo& s : i.segments) {
        segments.push_back({{"name", s.name},
                            {"bytes", s.bytes},
                            {"resident_bytes", s.resident},
                            {"uid", s.uid}});
      }
      doc.push_back({{"instance", i.id},
                     {"state", StateName(i.state)},
                     {"pid", i.pid},
                     {"bytes", Total(i, false)},
                     {"resident_bytes", Total(i, true)},
                     {"segments", segments}});
    }
    *c.out << JsonLine(Json{{"dir", o.dir}, {"instances", doc}}) << "\n";
    return kExitOk;
  }
  if (instances.empty()) {
    *c.out << "no hicached shared memory in " << o.dir << "\n";
    return kExitOk;
  }
  for (const ShmInstanceInfo& i : instances) {
    *c.out << absl::StrFormat(
        "%s %s%s: %d segments, %d bytes (%d resident)\n", i.id,
        StateName(i.state),
        i.pid.empty() ? "" : absl::StrCat(" (pid ", i.pid, ")"),
        i.segments.size(), Total(i, false), Total(i, true));
    for (const ShmSegmentInfo& s : i.segments) {
      *c.out << "  " << s.name << " " << s.bytes << "\n";
    }
  }
  return kExitOk;
}

int RunShmClean(const ShmOptions& o, const CommandContext& c) {
  if (!o.instance.empty() && !ValidId(o.instance)) {
    *c.err << "hicachectl: --instance '" << o.instance
           << "' is not an instance id ([A-Za-z][A-Za-z0-9_-]*)\n";
    return kExitUsage;
  }
  const int dir_fd = open(o.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    *c.err << "hicachectl: cannot open " << o.dir << ": "
           << std::strerror(errno) << "\n";
    return kExitFailure;
  }
  int exit_code = kExitOk;
  int64_t removed = 0;
  uint64_t freed = 0;
  bool matched = o.instance.empty();
  for (const ShmInstanceInfo& i : ScanShm(o.dir)) {
    if (!o.instance.empty() && i.id != o.instance) continue;
    matched = true;
    if (i.state == ShmInstanceInfo::State::kLive) {
      *c.out << i.id << ": live (pid " << i.pid << "), left alone\n";
      continue;
    }
    // Hold the instance's lock while removing, as a starting daemon would:
    // one that starts now is refused the instance instead of losing pools.
    const std::string lock = absl::StrCat(kPrefix, i.id, kLockSuffix);
    const int fd =
        openat(dir_fd, lock.c_str(),
               O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
    if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
      *c.out << i.id << ": could not take its lock ("
             << std::strerror(errno) << "), left alone\n";
      if (fd >= 0) close(fd);
      exit_code = kExitFailure;
      continue;
    }
    for (const ShmSegmentInfo& s : i.segments) {
      if (geteuid() != 0 && s.uid != geteuid()) {
        *c.out << "  " << s.name << ": owned by uid " << s.uid
               << ", left alone\n";
        exit_code = kExitFailure;
        continue;
      }
      if (o.dry_run) {
        *c.out << "  would remove " << s.name << " (" << s.bytes
               << " bytes)\n";
        continue;
      }
      if (unlinkat(dir_fd, s.name.c_str(), 0) != 0) {
        *c.out << "  " << s.name << ": " << std::strerror(errno) << "\n";
        exit_code = kExitFailure;
        continue;
      }
      ++removed;
      freed += s.resident;
    }
    if (!o.dry_run) unlinkat(dir_fd, lock.c_str(), 0);
    close(fd);  // Releases the lock.
    if (!o.dry_run) *c.out << i.id << ": " << StateName(i.state) << ", removed\n";
  }
  close(dir_fd);
  if (!matched) {
    *c.err << "hicachectl: no instance '" << o.instance << "' in " << o.dir
           << "\n";
    return kExitFailure;
  }
  if (!o.dry_run) {
    *c.out << "removed " << removed << " segments, freed " << freed
           << " bytes\n";
  }
  return exit_code;
}

}  // namespace hicache::ctl
