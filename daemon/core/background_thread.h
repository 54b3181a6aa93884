#pragma once

// Background threads that must not slow the threads that serve: the calling
// thread asks the kernel to run it only when a CPU would otherwise be idle
// (SCHED_IDLE). A waking serving thread then preempts it at once, and it
// never competes with them for CPU time, only for what they leave; under a
// CPU that stays saturated it gets very little (the kernel still gives an
// idle-class thread a small share), so its work must be bounded and
// droppable (docs/hot-restart.md: the journal's queues are, and a Flush
// waits for it).
//
// Falls back to nice 19 where SCHED_IDLE is refused (a seccomp or container
// policy); logs a warning naming `who` when neither can be set.

namespace hicache {

void RunAsBackgroundThread(const char* who);

}  // namespace hicache
