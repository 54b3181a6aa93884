#include "client/cpp/endpoint.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

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

}  // namespace hicache::client
