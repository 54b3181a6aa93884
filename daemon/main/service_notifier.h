#pragma once

// NotifyServiceManager: tells systemd (Type=notify) the daemon's state, as
// sd_notify(3) does, through libsystemd loaded at run time. The daemon thus
// needs no libsystemd where no service manager waits for it (a container, a
// GPU bundle): when $NOTIFY_SOCKET is unset nothing is loaded; when it is set
// and libsystemd.so.0 cannot be loaded, one warning is logged and the
// notification is dropped (systemd then times the start out, which names the
// problem). Thread-safe.

#include <string_view>

namespace hicache {

// `state` as sd_notify takes it, e.g. "READY=1" or "STOPPING=1".
void NotifyServiceManager(const char* state);

}  // namespace hicache
