#pragma once

// The lifetime of a session's streams -- BackupSession (BackupStream),
// LoadBack (LoadStream) and a worker's Subscribe (WorkerSubscription) --
// lives in the engine layer, apart from any transport: what each stream owns
// in the engine, which events reach it, and what happens to its operations
// when its client goes away. The service only converts and writes messages;
// the fuzzer drives the same classes in-process.

#include <cstddef>
#include <functional>

#include "daemon/engine/event_hub.h"
#include "daemon/engine/hicache_engine.h"
#include "daemon/engine/session_manager.h"

namespace hicache {

// What every stream shares: the session (counted against its stream limit
// from Open to destruction), the hub and a mailbox of at most `max_backlog`
// events whose overflow runs `on_overflow` once (cancel the RPC).
struct StreamContext {
  SessionManager* sessions = nullptr;
  EventHub* hub = nullptr;
  const HiCacheEngine* engine = nullptr;
  size_t max_backlog = 65536;
  std::function<void()> on_overflow = [] {};
};

}  // namespace hicache
