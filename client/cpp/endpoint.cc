#include "client/cpp/endpoint.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
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
