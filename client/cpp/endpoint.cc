#include "client/cpp/endpoint.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"

namespace hicache::client {

std::string DefaultSocketPath() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat(runtime_dir, "/hicached.sock");
  }
  return "/tmp/hicached.sock";
}

std::string UnixTarget(absl::string_view socket_path) {
  return absl::StrCat("unix:", socket_path);
}

std::string SocketPathOf(absl::string_view target) {
  if (!absl::ConsumePrefix(&target, "unix:")) return "";
  if (absl::StartsWith(target, "//")) target.remove_prefix(2);
  return std::string(target);
}

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// Whether `path` names something, even something this user may not see
// into (a socket in a directory without search permission).
bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 || errno == EACCES;
}

std::string GroupName(gid_t gid) {
  std::vector<char> buffer(16384);
  struct group entry;
  struct group* found = nullptr;
  if (::getgrgid_r(gid, &entry, buffer.data(), buffer.size(), &found) == 0 &&
      found != nullptr) {
    return found->gr_name;
  }
  return absl::StrCat(gid);
}

absl::Status Denied(const std::string& what, const std::string& path) {
  struct stat st;
  std::string owner;
  if (::stat(path.c_str(), &st) == 0) {
    const std::string group = GroupName(st.st_gid);
    owner = absl::StrFormat(
        " (group %s, mode %04o): add this user to group %s "
        "(sudo usermod -aG %s $USER, then log in again) or run as a member",
        group, st.st_mode & 07777, group, group);
  }
  return absl::PermissionDeniedError(
      absl::StrCat("permission denied: this user may not ", what, " ", path,
                   owner));
}

}  // namespace

Endpoint ResolveEndpoint(absl::string_view target, absl::string_view socket,
                         absl::string_view packaged_path) {
  Endpoint e;
  auto from_target = [&](std::string t, const char* source) {
    e.socket_path = SocketPathOf(t);
    e.target = std::move(t);
    e.source = source;
    return e;
  };
  auto from_socket = [&](std::string path, const char* source) {
    e.target = UnixTarget(path);
    e.socket_path = std::move(path);
    e.source = source;
    return e;
  };
  if (!target.empty()) return from_target(std::string(target), "--target");
  if (!socket.empty()) return from_socket(std::string(socket), "--socket");
  if (std::string t = Env("HICACHE_TARGET"); !t.empty()) {
    return from_target(std::move(t), "HICACHE_TARGET");
  }
  if (std::string s = Env("HICACHE_SOCKET"); !s.empty()) {
    return from_socket(std::move(s), "HICACHE_SOCKET");
  }
  if (!packaged_path.empty() && Exists(std::string(packaged_path))) {
    return from_socket(std::string(packaged_path), "packaged");
  }
  return from_socket(DefaultSocketPath(), "default");
}

absl::Status CheckSocket(absl::string_view path_view) {
  const std::string path(path_view);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != EACCES) {
      return absl::NotFoundError(
          absl::StrCat("no daemon at ", path, " (no such socket)"));
    }
    // A directory on the way this user may not search: name the first.
    std::string dir;
    for (size_t slash = path.find('/', 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      dir = path.substr(0, slash);
      if (::access(dir.c_str(), X_OK) != 0 && errno == EACCES) {
        return Denied("enter the directory", dir);
      }
    }
    return Denied("reach", path);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a socket: check --socket"));
  }
  if (::access(path.c_str(), R_OK | W_OK) != 0 && errno == EACCES) {
    return Denied("connect to the socket", path);
  }
  return absl::OkStatus();
}

absl::Span<const MethodName> RetriedReadMethods() {
  static constexpr MethodName kMethods[] = {
      {"grpc.health.v1.Health", "Check"},
      {"hicache.v1.HiCache", "GetStats"},
      {"hicache.v1.HiCache", "Stats"},
      {"hicache.v1.HiCache", "GetLayout"},
      {"hicache.v1.HiCache", "KeepAlive"},
      {"hicache.v1.HiCache", "DumpTree"},
      {"hicache.v1.HiCache", "InspectNode"},
      {"hicache.v1.HiCache", "QueryTiers"},
      {"hicache.v1.HiCache", "ListSessions"},
  };
  return kMethods;
}

std::string ServiceConfigJson(bool wait_for_ready) {
  // The names are fixed identifiers: no JSON escaping is needed.
  const std::string names = absl::StrJoin(
      RetriedReadMethods(), ",", [](std::string* out, const MethodName& m) {
        absl::StrAppend(out, "{\"service\":\"", m.service, "\",\"method\":\"",
                        m.method, "\"}");
      });
  return absl::StrCat(
      "{\"methodConfig\":[{\"name\":[", names,
      "],\"waitForReady\":", wait_for_ready ? "true" : "false",
      ",\"retryPolicy\":{\"maxAttempts\":", kReadMaxAttempts,
      ",\"initialBackoff\":\"0.05s\",\"maxBackoff\":\"1s\","
      "\"backoffMultiplier\":2,\"retryableStatusCodes\":[\"UNAVAILABLE\"]}}]}");
}

}  // namespace hicache::client
