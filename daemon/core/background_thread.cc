#include "daemon/core/background_thread.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include "spdlog/spdlog.h"

namespace hicache {

void RunAsBackgroundThread(const char* who) {
  sched_param param{};
  if (sched_setscheduler(0, SCHED_IDLE, &param) == 0) return;
  if (setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19) == 0) return;
  spdlog::warn("{}: could not lower the thread's priority; it runs at the "
               "daemon's",
               who);
}

}  // namespace hicache
