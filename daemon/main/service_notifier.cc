#include "daemon/main/service_notifier.h"

#include <dlfcn.h>

#include <cstdlib>

#include "spdlog/spdlog.h"

namespace hicache {
namespace {

using SdNotify = int (*)(int unset_environment, const char* state);

// sd_notify from libsystemd, or null (logged once) if it cannot be loaded.
SdNotify LoadSdNotify() {
  void* library = dlopen("libsystemd.so.0", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    spdlog::warn(
        "$NOTIFY_SOCKET is set but libsystemd.so.0 cannot be loaded ({}): "
        "the service manager is not told the daemon's state",
        dlerror());
    return nullptr;
  }
  auto notify = reinterpret_cast<SdNotify>(dlsym(library, "sd_notify"));
  if (notify == nullptr) {
    spdlog::warn("libsystemd.so.0 has no sd_notify: the service manager is "
                 "not told the daemon's state");
  }
  return notify;
}

}  // namespace

void NotifyServiceManager(const char* state) {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || *socket == '\0') return;
  static const SdNotify notify = LoadSdNotify();
  if (notify == nullptr) return;
  if (const int rc = notify(0, state); rc < 0) {
    spdlog::warn("sd_notify({}): error {}", state, -rc);
  }
}

}  // namespace hicache
